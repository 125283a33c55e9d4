"""``--force`` on an object store: the parts stage, then the driver replaces the epoch the way the single process does.

The single process's ``--force`` on S3 writes the new epoch into its local staging folder and uploads
nothing meanwhile (its uploader is off while the epoch is published: uploads would change the epoch under
its readers); publication then removes the old epoch, manifest first, uploads the new files and writes
the new manifest last. Spread over a cluster, each part stages its files on its own node
(``PartSpec.defer``) and reports its checksums and statistics; once every part has, :func:`upload_staged`
removes the published epoch (manifest first, as the single process's publication does) and runs an upload
task on each part's node, pinned there, which uploads that part's staged files and then records the part
(:mod:`pgprefetch.store.records`): a driver killed from then on is resumed by the next run. So readers see the old epoch
until the same moment as with the single process, and a failed rewrite never mixes old and new files.

A part whose node was lost before its files went up (its staging with it) is written again; with the old
epoch gone it uploads as it goes, like any part of a new epoch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from pgprefetch.errors import PgprefetchError
from pgprefetch.store.objects import ObjectStore
from pgprefetch.store.open import open_store
from pgprefetch.store.records import put_record
from pgprefetch.store.uploads import Uploads
from pgprefetch.write.ray.cluster import TASK_RETRIES, failure
from pgprefetch.write.ray.part import PartResult, PartSpec, record


@ray.remote(num_cpus=0, max_retries=TASK_RETRIES)
def upload_part(spec: PartSpec, header: dict[str, Any], result: PartResult) -> None:
    """On the node that staged part ``spec``: upload its files, then record it."""
    store = open_store(spec.location).object_store
    assert store is not None, "staged parts upload to an object store"
    partial = store.partial_path(spec.epoch)
    with Uploads(store, spec.epoch) as uploads:
        for relative in result.files:
            uploads.submit(partial / relative)
    put_record(store, spec.epoch, record(spec, header, result, partial))


def upload_staged(
    store: ObjectStore,
    specs: list[PartSpec],
    results: list[PartResult],
    header: dict[str, Any],
    options: dict[str, Any],
) -> list[PartSpec]:
    """Remove the published epoch, then upload every part's staged files from its node.

    Returns the parts to write again (their node, or their staged files, lost meanwhile), uploading this time.
    """
    epoch = specs[0].epoch
    lease = store.held_lease(epoch)
    if lease is not None:  # as the single process's publication: a dump that lost its lease removes nothing
        lease.check()
    store.remove_epoch(epoch)
    refs = {}
    for result in results:
        spec = specs[result.index]
        there = NodeAffinitySchedulingStrategy(result.node_id, soft=False)
        refs[upload_part.options(scheduling_strategy=there, **options).remote(spec, header, result)] = spec
    again = []
    for ref, spec in refs.items():
        try:
            ray.get(ref)
        except ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, PgprefetchError) or not isinstance(e.cause, OSError):
                raise failure(e, f"uploading {spec.name()}") from None
            again.append(dataclasses.replace(spec, defer=False))  # its staged files are gone
        except ray.exceptions.RayError:  # its node is gone (unschedulable there), or its worker, every retry
            again.append(dataclasses.replace(spec, defer=False))
    return again


__all__ = ["upload_part", "upload_staged"]
