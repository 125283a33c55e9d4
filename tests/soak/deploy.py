"""The command lines of deploy/, read from the files as an operator installs them.

The soak runs these, not copies of them: a change to a deployment file is a change to what the soak runs.
Each reader returns the argv of one command (the program first), with shell redirections left out; the
soak then swaps the install paths for its own (:func:`substitute`).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
CRONTAB = DEPLOY / "crontab"
SERVICE = DEPLOY / "systemd" / "pgprefetch-dump.service"
TIMER = DEPLOY / "systemd" / "pgprefetch-dump.timer"
CRONJOB = DEPLOY / "kubernetes" / "dump-cronjob.yaml"
TRAIN_JOB = DEPLOY / "kubernetes" / "train-job.yaml"
_REDIRECTIONS = (">", ">>", "<", "|", "&&", ";", "2>&1", "2>", "&>")


def crontab_entries(path: Path = CRONTAB) -> list[tuple[str, list[str]]]:
    """Each job of a crontab: (its five schedule fields, its command's argv up to the first redirection).

    Blank lines, comments and environment lines (``NAME=value``) are not jobs.
    """
    jobs = []
    for line in path.read_text().splitlines():
        text = line.strip()
        if not text or text.startswith("#") or _is_assignment(text):
            continue
        fields = text.split(None, 5)
        if len(fields) < 6:
            raise ValueError(f"{path}: not a crontab job (five schedule fields and a command): {line!r}")
        argv = []
        for word in shlex.split(fields[5]):
            if word in _REDIRECTIONS or word.startswith((">", "2>")):
                break
            argv.append(word)
        jobs.append((" ".join(fields[:5]), argv))
    return jobs


def crontab_environment(path: Path = CRONTAB) -> dict[str, str]:
    """The ``NAME=value`` lines of a crontab: what cron puts in each job's environment."""
    out = {}
    for line in path.read_text().splitlines():
        text = line.strip()
        if text and not text.startswith("#") and _is_assignment(text):
            name, _, value = text.partition("=")
            out[name.strip()] = value.strip()
    return out


def _is_assignment(text: str) -> bool:
    name, eq, _ = text.partition("=")
    return bool(eq) and name.strip().isidentifier() and " " not in name.strip()


def unit_sections(path: Path) -> dict[str, list[tuple[str, str]]]:
    """A systemd unit file as sections of (key, value) pairs, in order; keys may repeat (Environment=).

    Follows systemd.syntax(7): comments start with ``#`` or ``;``, a line ending in a backslash goes on.
    """
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    pending = ""
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = pending + raw.strip()
        pending = ""
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise ValueError(f"{path}:{number}: a section header must end with ]: {raw!r}")
            current = sections.setdefault(line[1:-1], [])
            continue
        key, eq, value = line.partition("=")
        if not eq or current is None:
            raise ValueError(f"{path}:{number}: expected Key=value inside a [Section]: {raw!r}")
        current.append((key.strip(), value.strip()))
    return sections


def service_command(path: Path = SERVICE) -> list[str]:
    """The argv of a service's ``ExecStart=`` (its one command)."""
    starts = [v for k, v in unit_sections(path).get("Service", []) if k == "ExecStart"]
    if len(starts) != 1:
        raise ValueError(f"{path}: expected one ExecStart=, found {len(starts)}")
    return shlex.split(starts[0].lstrip("-@:+!"))  # systemd's prefixes (ignore failure, ...) are not the command


def documents(path: Path) -> list[dict[str, Any]]:
    """The YAML documents of a Kubernetes manifest."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def container_command(path: Path, kind: str) -> list[str]:
    """The argv (command + args) of the one container of the ``kind`` object (CronJob, Job) in ``path``."""
    (obj,) = [d for d in documents(path) if d.get("kind") == kind]
    spec = obj["spec"]
    if kind == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    (container,) = spec["template"]["spec"]["containers"]
    return [str(w) for w in (*container.get("command", ()), *container.get("args", ()))]


def pgprefetch_args(argv: list[str]) -> list[str]:
    """The arguments after the ``pgprefetch`` program, wherever it was installed."""
    if not argv or Path(argv[0]).name != "pgprefetch":
        raise ValueError(f"not a pgprefetch command line: {argv}")
    return argv[1:]


def substitute(args: list[str], **values: str) -> list[str]:
    """``args`` with the value after each ``--option`` named in ``values`` replaced (``state_dir``: --state-dir)."""
    out = list(args)
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if flag not in out:
            raise ValueError(f"{flag} is not in {args}")
        out[out.index(flag) + 1] = value
    return out


def dump_commands() -> dict[str, list[str]]:
    """The dump command of each deployment file, as arguments to ``pgprefetch``."""
    cron = next(argv for _, argv in crontab_entries() if argv[1:2] == ["dump"])
    return {
        "crontab": pgprefetch_args(cron),
        "systemd": pgprefetch_args(service_command()),
        "kubernetes": pgprefetch_args(container_command(CRONJOB, "CronJob")),
    }


def prune_command() -> list[str]:
    """The crontab's prune job, as arguments to ``pgprefetch``."""
    return pgprefetch_args(next(argv for _, argv in crontab_entries() if argv[1:2] == ["prune"]))


def train_command() -> list[str]:
    """The training Job's command: the script (relative to the repository) and its arguments."""
    argv = container_command(TRAIN_JOB, "Job")
    if Path(argv[0]).name != "python" or not argv[1].endswith("examples/stream_train.py"):
        raise ValueError(f"{TRAIN_JOB}: expected python .../examples/stream_train.py, got {argv[:2]}")
    return ["examples/stream_train.py", *argv[2:]]
