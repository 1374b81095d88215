"""What Slurm's commands print, read (issue 38 F2): `sacct --json`, `squeue --json` and
`sinfo --json` (Slurm 21.08 and later), so no character of a job's name or a node's reason can
shift a field. Each record is read alone: one this version cannot read is *quarantined* (set
aside with why, and counted in the cluster's import status), never stopping the others. A
document whose ``errors`` are not empty is the command's failure (F7), never "no jobs".

One field is read from sacct's text: Slurm 22.05's JSON loses a job's exit code (a job that
exits 3 reads ``{"status": "SUCCESS", "return_code": 0}`` there, and "3:0" in ``sacct -P``).
Its text fields (the job's raw id, its start, its exit code) are digits, times and colons:
none can hold the delimiter.

An array's pending tasks are one record (job 6 with tasks "2-8%1") until each task starts and
becomes a job of its own ("6_2"): that record is not a job here (F1). Its tasks are imported as
they appear, each with the array's submission time, as accounting lists each task.

Pure: nothing here runs a command or touches the database.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

from backend.slurm.rules import SlurmJob, SlurmNode, gres_indexes

# The fields asked of `sacct -X -P` for each job's exit code (see above), in order.
EXIT_FIELDS = ("JobIDRaw", "Start", "ExitCode")
# A job's raw id as sacct's text prints it, and every id `sacct --jobs` may be asked for: a
# job, an array's task, a heterogeneous job's part (never a pending range: "6_[2-8%1]").
JOB_ID = re.compile(r"\d+(?:_\d+|\+\d+)?")
UNKNOWN_TIMES = {"", "Unknown", "None", "N/A"}
MAX_WHY = 200

T = TypeVar("T")


class BadSlurmOutput(ValueError):
    """A Slurm command printed what this version of Astraeus does not read."""


class SlurmSaidError(BadSlurmOutput):
    """A Slurm command's JSON carries errors: it failed, whatever else it printed."""


@dataclass(frozen=True)
class Quarantined:
    """A record that could not be read: which (as far as it says), and why."""

    what: str  # "job 12", "node gpu01", "job #3 of sacct" (its place where it has no id)
    why: str


@dataclass(frozen=True)
class Read(Generic[T]):
    """What one command gave: the records read, and those set aside."""

    found: list[T]
    quarantined: list[Quarantined]


def document_of(command: str, parsed: object, key: str) -> list[Any]:
    """The records of a command's JSON (``jobs``, ``nodes``), once its ``errors`` are empty."""
    if not isinstance(parsed, dict):
        raise BadSlurmOutput(f"{command} --json printed no object")
    listed = parsed.get("errors") or []
    errors = [
        e for e in (listed if isinstance(listed, list) else [listed]) if not _nothing_found(e)
    ]
    if errors:
        said = "; ".join(_error_text(e) for e in errors)
        raise SlurmSaidError(f"{command} failed: {said}"[:1000])
    records = parsed.get(key)
    if not isinstance(records, list):
        raise BadSlurmOutput(f"{command} --json printed no list of {key}")
    return records


# What sacct says of a selection that matches no job (`--jobs` of a job it has not heard of):
# an answer, not a failure.
NOTHING_FOUND = 9003


def _nothing_found(error: object) -> bool:
    return isinstance(error, dict) and error.get("error_number") == NOTHING_FOUND


def _error_text(error: object) -> str:
    if isinstance(error, dict):
        for field in ("description", "error"):
            if error.get(field):
                return str(error[field])
    return str(error)


def each(
    records: list[Any], read: Callable[[dict[str, Any]], T | None], what: Callable[[Any, int], str]
) -> Read[T]:
    """Every record read alone: one that raises is quarantined; None is not a record here."""
    found: list[T] = []
    quarantined: list[Quarantined] = []
    for place, record in enumerate(records):
        try:
            if not isinstance(record, dict):
                raise BadSlurmOutput("not an object")
            item = read(record)
        except (BadSlurmOutput, ValueError, KeyError, TypeError, AttributeError) as e:
            why = f"{type(e).__name__}: {e}" if not isinstance(e, BadSlurmOutput) else str(e)
            quarantined.append(Quarantined(what(record, place), why[:MAX_WHY]))
            continue
        if item is not None:
            found.append(item)
    return Read(found, quarantined)


def _job_what(record: Any, place: int) -> str:
    if isinstance(record, dict) and isinstance(record.get("job_id"), int):
        return f"job {record['job_id']}"
    return f"job #{place + 1}"


def _node_what(record: Any, place: int) -> str:
    if isinstance(record, dict) and isinstance(record.get("name"), str):
        return f"node {record['name'][:64]}"
    return f"node #{place + 1}"


# ---- fields ----


def utc(text: str) -> datetime | None:
    """A time as Slurm prints it under TZ=UTC and SLURM_TIME_FORMAT=%Y-%m-%dT%H:%M:%S."""
    if text in UNKNOWN_TIMES:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    except ValueError as e:
        raise BadSlurmOutput(f"not a time: {text!r}") from e


def epoch(value: object) -> datetime | None:
    """A time in Slurm's JSON (seconds since the epoch; 0 or null for none)."""
    if value is None or value == 0:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadSlurmOutput(f"not a time: {value!r}")
    return datetime.fromtimestamp(value, UTC)


def _text(record: dict[str, Any], key: str) -> str:
    value = record.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadSlurmOutput(f"{key} is not text: {value!r}")
    return value


def _int(value: object, default: int = 0) -> int:
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadSlurmOutput(f"not a number: {value!r}")
    return value


_TRES_GPU = re.compile(r"(?:^|,)gres/gpu(?::[^=,]+)?=(\d+)")
_TRES_UNTYPED = re.compile(r"(?:^|,)gres/gpu=(\d+)")


def tres_gpus(tres: str) -> int:
    """The GPUs a TRES string counts ("cpu=1,gres/gpu=2,mem=100M"): the untyped count, else
    the typed ones ("gres/gpu:h100=2") summed."""
    untyped = _TRES_UNTYPED.search(tres)
    if untyped:
        return int(untyped.group(1))
    return sum(int(n) for n in _TRES_GPU.findall(tres))


def _tres_list_gpus(tres: object) -> int:
    """The GPUs of sacct's JSON TRES list ({"type": "gres", "name": "gpu", "count": 2}), as
    ``tres_gpus`` counts its text."""
    if not tres:
        return 0
    if not isinstance(tres, list):
        raise BadSlurmOutput("tres is not a list")
    text = ",".join(
        f"gres/{t.get('name')}={_int(t.get('count'))}"
        for t in tres
        if isinstance(t, dict) and t.get("type") == "gres" and isinstance(t.get("name"), str)
    )
    return tres_gpus(text)


def _tres_count(tres: object, kind: str) -> int | None:
    for t in tres if isinstance(tres, list) else []:
        if isinstance(t, dict) and t.get("type") == kind:
            return _int(t.get("count"), 0) or None
    return None


def hostnames(expression: str) -> tuple[str, ...]:
    """A Slurm host list expanded: "gpu[01-03,07],cpu1" -> gpu01, gpu02, gpu03, gpu07, cpu1."""
    if expression in ("", "None assigned", "(null)"):
        return ()
    names: list[str] = []
    for part in _split_top(expression):
        match = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\](.*)", part)
        if match is None:
            names.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        for item in ranges.split(","):
            low, _, high = item.partition("-")
            if not high:
                names.append(f"{prefix}{low}{suffix}")
                continue
            width = len(low)
            for n in range(int(low), int(high) + 1):
                names.append(f"{prefix}{n:0{width}d}{suffix}")
    return tuple(names)


def _split_top(expression: str) -> list[str]:
    """Split at the commas outside brackets."""
    parts, depth, current = [], 0, ""
    for ch in expression:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if current:
        parts.append(current)
    return parts


# ---- sacct ----


def parse_sacct(
    document: object, exits: dict[tuple[str, str], str] | None = None
) -> Read[SlurmJob]:
    """`sacct -X --json`'s jobs (one record per allocation; a requeued job's instances each
    with ``--duplicates``); ``exits``: ``parse_exit_codes`` of the same selection."""
    records = document_of("sacct", document, "jobs")
    return each(records, lambda r: _sacct_job(r, exits or {}), _job_what)


def _sacct_job(record: dict[str, Any], exits: dict[tuple[str, str], str]) -> SlurmJob | None:
    job_id = _job_id(record)
    if job_id is None:
        return None  # an array's pending tasks: each is a job once it starts
    times = record.get("time") or {}
    submit = epoch(times.get("submission"))
    if submit is None:
        return None  # not yet submitted as far as accounting knows
    started = epoch(times.get("start"))
    tres = record.get("tres") or {}
    requested = tres.get("requested")
    exit_text = exits.get((str(record["job_id"]), _stamp(started)))
    if not hostnames(_text(record, "nodes")):
        # never given nodes: a job cancelled while it waited (held, before its BeginTime) is
        # dated started and ended at its cancel by 22.05 (start = end, elapsed 0): it never ran
        started = None
    code, sig = _exit_code(record.get("exit_code"), exit_text)
    limit = times.get("limit")
    state = record.get("state") or {}
    base = str(state.get("current") or "").split(" ")[0].rstrip("+")
    return SlurmJob(
        job_id=job_id,
        name=_text(record, "name"),
        account=_text(record, "account"),
        partition=_text(record, "partition"),
        user=_text(record, "user"),
        state=base,
        submit=submit,
        start=started,
        end=epoch(times.get("end")),
        nodes=hostnames(_text(record, "nodes")) if started else (),
        node_count=(_int(record.get("allocation_nodes")) if started else 0)
        or _tres_count(requested, "node")
        or 1,
        gpus=(_tres_list_gpus(tres.get("allocated")) if started else 0)
        or _tres_list_gpus(requested),
        exit_code=code,
        signal=sig,
        time_limit=timedelta(minutes=_int(limit)) if limit else None,
        priority=_priority(record.get("priority")),
        qos=_text(record, "qos"),
        cancelled_by=(_text(record, "kill_request_user") or None) if base == "CANCELLED" else None,
    )


def _job_id(record: dict[str, Any]) -> str | None:
    """The job's id as sacct's JobID prints it; None for an array's pending tasks."""
    raw = _int(record.get("job_id"))
    if raw <= 0:
        raise BadSlurmOutput(f"no job id: {raw!r}")
    array = record.get("array") or {}
    array_job = _int(array.get("job_id"))
    if array_job:
        task = array.get("task_id")
        return None if task is None else f"{array_job}_{_int(task)}"
    het = record.get("het") or {}
    het_job, offset = _int(het.get("job_id")), het.get("job_offset")
    if het_job and offset is not None:
        return f"{het_job}+{_int(offset)}"
    return str(raw)


def _priority(value: object) -> int:
    if isinstance(value, dict):  # later versions: {"set": true, "number": 5}
        value = value.get("number")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _stamp(moment: datetime | None) -> str:
    return f"{moment:%Y-%m-%dT%H:%M:%S}" if moment else "Unknown"


def _exit_code(found: object, text: str | None) -> tuple[int | None, int | None]:
    """A job's exit code and signal: sacct's text "3:0" where it has the job, else the JSON's."""
    if text is not None:
        code, _, sig = text.partition(":")
        return (int(code) if code.isdigit() else None, int(sig) if sig.isdigit() else None)
    if not isinstance(found, dict):
        return None, None
    signal = found.get("signal") or {}
    number = signal.get("signal_id") if isinstance(signal, dict) else None
    returned = found.get("return_code")
    killed = number if isinstance(number, int) and number > 0 else 0
    return (returned if isinstance(returned, int) else (0 if killed else None), killed)


def parse_exit_codes(text: str) -> dict[tuple[str, str], str]:
    """`sacct -X -P -n -o JobIDRaw,Start,ExitCode`: (raw id, start) -> "code:signal". A line
    of any other shape is left out (its job reads the JSON's exit code)."""
    out = {}
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) == len(EXIT_FIELDS) and fields[0].isdigit():
            raw, start, code = fields
            out[(raw, "Unknown" if start in UNKNOWN_TIMES else start)] = code
    return out


def askable(job_ids: Iterable[str]) -> list[str]:
    """The ids `sacct --jobs` may be asked for (a phantom of an earlier version's import, a
    pending range "6_[2-8%1]", makes sacct exit: "Bad job array element specified")."""
    return [j for j in job_ids if JOB_ID.fullmatch(j)]


def not_jobs(asked: Iterable[str], answered: Iterable[str]) -> list[str]:
    """Of the ids sacct was asked for by id, those that name no job of its own: a pending range
    ("6_[2-8%1]"), or an array whose answer is its tasks only ("6" answered by "6_1", "6_2"):
    an earlier version's import made runs of them (issue 38 F1)."""
    found = set(answered)
    return [
        job
        for job in asked
        if not JOB_ID.fullmatch(job)
        or (job not in found and any(other.startswith(f"{job}_") for other in found))
    ]


# ---- squeue ----


def parse_squeue(document: object) -> Read[SlurmJob]:
    """`squeue --json`'s jobs: the queue as slurmctld sees it now, with each pending job's
    reason and priority (sacct's lag behind and keep no live reason)."""
    return each(document_of("squeue", document, "jobs"), _queued_job, _job_what)


def _queued_job(job: dict[str, Any]) -> SlurmJob | None:
    submit = epoch(job.get("submit_time"))
    if submit is None:
        return None
    state = _text(job, "job_state")
    started = epoch(job.get("start_time")) if state != "PENDING" else None
    array_task, array_job = job.get("array_task_id"), _int(job.get("array_job_id"))
    job_id = str(_int(job.get("job_id")))
    if array_job and array_task is None:
        return None  # an array's pending tasks ("2-8%1"): each is a job once it starts
    if array_job:
        job_id = f"{array_job}_{_int(array_task)}"
    het_job = _int(job.get("het_job_id"))
    if het_job:  # a heterogeneous job's part, as sacct names it (its own id is squeue's)
        job_id = f"{het_job}+{_int(job.get('het_job_offset'))}"
    limit = job.get("time_limit")
    tres = _text(job, "tres_alloc_str") if started else ""
    return SlurmJob(
        job_id=job_id,
        name=_text(job, "name"),
        account=_text(job, "account"),
        partition=_text(job, "partition"),
        user=_text(job, "user_name"),
        state=state,
        submit=submit,
        start=started,
        nodes=hostnames(_text(job, "nodes")) if started else (),
        node_count=_int(job.get("node_count")) or 1,
        gpus=tres_gpus(tres) or tres_gpus(_text(job, "tres_req_str")),
        time_limit=timedelta(minutes=limit) if isinstance(limit, int) and limit else None,
        priority=_priority(job.get("priority")),
        qos=_text(job, "qos"),
        reason=_text(job, "state_reason"),
        gpu_indexes=(
            tuple(gres_indexes(str(d)) for d in job.get("gres_detail") or []) if started else ()
        ),
    )


# ---- sinfo ----


def parse_sinfo(document: object) -> Read[SlurmNode]:
    """`sinfo --json`'s nodes, each with its partitions."""
    return each(document_of("sinfo", document, "nodes"), _node, _node_what)


def _node(node: dict[str, Any]) -> SlurmNode:
    name = _text(node, "name")
    if not name:
        raise BadSlurmOutput("a node without a name")
    partitions = node.get("partitions") or []
    if not isinstance(partitions, list):
        raise BadSlurmOutput("partitions is not a list")
    flags = node.get("state_flags") or []
    gpus, model = _gres_gpus(_text(node, "gres"))
    reason = _text(node, "reason")
    return SlurmNode(
        name=name,
        partitions=tuple(str(p) for p in partitions),
        gpus=gpus,
        gpu_model=model,
        cpus=float(_int(node.get("cpus"))),
        memory_bytes=_int(node.get("real_memory")) * 1024 * 1024,
        state=long_state(_text(node, "state"), [str(f) for f in flags]),
        reason="" if reason == "none" else reason,
    )


def long_state(state: str, flags: list[str]) -> str:
    """A node's state as sinfo's %T says it, from the JSON's base state and flags (idle with
    DRAIN is "drained"; allocated with DRAIN "draining"; NOT_RESPONDING adds a "*")."""
    base, said = state.lower(), {f.upper() for f in flags}
    busy = base in ("allocated", "mixed") or "COMPLETING" in said
    if "DRAIN" in said:
        name = "draining" if busy else "drained"
    elif "FAIL" in said:
        name = "failing" if busy else "fail"
    elif "COMPLETING" in said:
        name = "completing"
    else:
        name = base
    return name + ("*" if "NOT_RESPONDING" in said else "")


def _gres_gpus(gres: str) -> tuple[int, str]:
    """A node's gres: "gpu:2", "gpu:h100:8(S:0-1)", "gpu:a100:4,gpu:v100:2", "(null)"."""
    total, models = 0, []
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        count = parts[-1]
        if count.isdigit():
            total += int(count)
            if len(parts) == 3:
                models.append(parts[1])
    return total, "/".join(models) if models else "GPU (Slurm gres)"
