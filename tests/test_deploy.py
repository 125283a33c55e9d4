"""deploy/: the crontab, the systemd units and the Kubernetes manifests parse, and say one dump command.

The soak (tests/soak) runs these command lines as the files hold them; these tests check the files
themselves: the crontab's schedule fields, the units by ``systemd-analyze verify`` where this machine has
it (and by a parser of systemd's syntax and the keys used, everywhere), the manifests as YAML with the
fields Kubernetes requires, and every command line by the program that will run it (click's parser for
``pgprefetch``, argparse for the training example).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pgprefetch.cli import cli

from .soak import deploy
from .soak.check import example_module

CRON_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))  # minute, hour, day of month, month, day of week
SERVICE_KEYS = {
    "Unit": {"Description", "Wants", "After", "Documentation"},
    "Service": {"Type", "User", "Group", "EnvironmentFile", "Environment", "LoadCredential", "CacheDirectory",
                "ExecStart", "TimeoutStartSec", "TimeoutStopSec", "Nice", "MemoryMax"},
}  # fmt: skip
TIMER_KEYS = {
    "Unit": {"Description"},
    "Timer": {"OnActiveSec", "OnUnitInactiveSec", "AccuracySec"},
    "Install": {"WantedBy"},
}


def cron_field_ok(field: str, low: int, high: int) -> bool:
    """One crontab schedule field: ``*``, numbers, ranges and steps, comma-separated, within its range."""
    for part in field.split(","):
        base, _, step = part.partition("/")
        if step and not step.isdigit():
            return False
        if base == "*":
            continue
        bounds = base.split("-")
        if not all(b.isdigit() and low <= int(b) <= high for b in bounds) or len(bounds) > 2:
            return False
    return True


def test_the_crontab_schedules_a_dump_and_a_prune_with_the_dsn_from_its_environment() -> None:
    jobs = deploy.crontab_entries()
    assert [argv[:2] for _, argv in jobs] == [["pgprefetch", "dump"], ["pgprefetch", "prune"]]
    for schedule, _ in jobs:
        fields = schedule.split()
        assert len(fields) == 5
        assert all(cron_field_ok(f, *bounds) for f, bounds in zip(fields, CRON_RANGES, strict=True)), schedule
    env = deploy.crontab_environment()
    assert set(env) == {"PGPREFETCH_DSN"}
    assert "@" in env["PGPREFETCH_DSN"]
    assert ":" not in env["PGPREFETCH_DSN"].split("//")[1].split("@")[0]  # a user, no password: that is in ~/.pgpass


def test_the_three_deployment_files_hold_one_dump_command_that_pgprefetch_parses() -> None:
    commands = deploy.dump_commands()
    assert set(commands) == {"crontab", "systemd", "kubernetes"}
    (args,) = {tuple(a) for a in commands.values()}
    for command in ([*args], deploy.prune_command()):
        context = cli.commands[command[0]].make_context(command[0], command[1:])  # click's own parsing
        assert context.params["config_path"] == Path("/etc/pgprefetch/train.toml")
    parsed = cli.commands["dump"].make_context("dump", [*args][1:]).params
    assert (parsed["ahead"], parsed["keep"], parsed["consumer"], parsed["as_json"]) == (2, 1, "train", True)


def test_the_systemd_units_follow_systemd_syntax_with_the_keys_they_mean() -> None:
    service = deploy.unit_sections(deploy.SERVICE)
    timer = deploy.unit_sections(deploy.TIMER)
    for sections, known in ((service, SERVICE_KEYS), (timer, TIMER_KEYS)):
        assert set(sections) == set(known)
        for name, pairs in sections.items():
            assert {k for k, _ in pairs} <= known[name], (name, pairs)
    settings = dict(service["Service"])
    assert settings["Type"] == "oneshot"
    for key in ("TimeoutStartSec", "TimeoutStopSec"):
        assert re.fullmatch(r"\d+(ms|s|min|h)", settings[key]), settings[key]
    for key, value in timer["Timer"]:
        assert re.fullmatch(r"\d+(ms|s|min|h)", value), (key, value)
    environment = [v for k, v in service["Service"] if k == "Environment"]
    assert "PGPASSFILE=%d/pgpass" in environment  # the password from a credential, never in the unit
    assert not any("password" in v.lower() or "@" in v for v in environment)
    assert deploy.service_command()[0] == "/usr/local/bin/pgprefetch"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_the_systemd_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    # verify checks that ExecStart's program exists: point it at this environment's pgprefetch.
    installed = Path(sys.executable).parent / "pgprefetch"
    assert installed.exists()
    for unit in (deploy.SERVICE, deploy.TIMER):
        (tmp_path / unit.name).write_text(unit.read_text().replace("/usr/local/bin/pgprefetch", str(installed)))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / deploy.SERVICE.name), str(tmp_path / deploy.TIMER.name)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stdout + done.stderr) == (0, "")  # no error, and no warning either


def test_the_kubernetes_manifests_are_a_cronjob_and_an_indexed_job_with_secrets_by_reference() -> None:
    (cronjob,) = deploy.documents(deploy.CRONJOB)
    (job,) = deploy.documents(deploy.TRAIN_JOB)
    for obj, kind in ((cronjob, "CronJob"), (job, "Job")):
        assert (obj["apiVersion"], obj["kind"], bool(obj["metadata"]["name"])) == ("batch/v1", kind, True)
    spec = cronjob["spec"]
    assert all(cron_field_ok(f, *b) for f, b in zip(spec["schedule"].split(), CRON_RANGES, strict=True))
    assert spec["concurrencyPolicy"] in ("Allow", "Forbid", "Replace")
    assert spec["jobTemplate"]["spec"]["activeDeadlineSeconds"] > 0
    pod = spec["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["restartPolicy"] in ("Never", "OnFailure")
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["PGPREFETCH_DSN"]["valueFrom"]["secretKeyRef"] == {"name": "pgprefetch-db", "key": "dsn"}
    assert container["envFrom"] == [{"secretRef": {"name": "pgprefetch-s3"}}]
    mounted = {m["name"] for m in container["volumeMounts"]}
    assert mounted == {v["name"] for v in pod["volumes"]}
    train = job["spec"]
    assert (train["completionMode"], train["completions"], train["parallelism"]) == ("Indexed", 2, 2)
    args = deploy.train_command()
    assert args[args.index("--world-size") + 1] == str(train["completions"])


def test_the_training_job_runs_the_example_with_options_it_takes() -> None:
    args = deploy.train_command()
    assert args[0] == "examples/stream_train.py"
    parsed = example_module().arguments().parse_args(args[1:])
    assert (parsed.store, parsed.consumer, parsed.world_size, parsed.workers) == ("s3://training/run-7", "train", 2, 2)
    assert (
        parsed.consumer
        == deploy.dump_commands()["kubernetes"][deploy.dump_commands()["kubernetes"].index("--consumer") + 1]
    )


def test_each_deployment_limits_the_dump_to_its_budget_plus_the_floor_and_the_slack() -> None:
    """The container's limit and the unit's MemoryMax leave room for ``--memory`` + floor + slack, and not much more."""
    from pgprefetch.config.values import parse_size
    from pgprefetch.write.memory.policy import FLOOR, SLACK

    (args,) = {tuple(a) for a in deploy.dump_commands().values()}
    budget = parse_size(args[args.index("--memory") + 1], "--memory")
    (job,) = [d for d in deploy.documents(deploy.CRONJOB) if d["kind"] == "CronJob"]
    (container,) = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    limits = [container["resources"]["limits"]["memory"], container["resources"]["requests"]["memory"]]
    service = dict(deploy.unit_sections(deploy.SERVICE)["Service"])
    for limit in [int(v.removesuffix("Mi")) << 20 for v in limits] + [
        int(service["MemoryMax"].removesuffix("M")) << 20
    ]:
        assert budget + FLOOR + SLACK <= limit <= budget + 128 * (1 << 20), (limit, budget)
