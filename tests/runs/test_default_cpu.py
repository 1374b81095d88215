"""A worker whose specification names no ``cpu`` reserves a tenth of a core, with no CPU limit
(issue 36: the default of 1 core fitted one 2-rank run on a 2-core laptop); a ``cpu`` given is
reserved and enforced exactly. The scheduler reserves what the spec says, the machine limits it."""

from __future__ import annotations

from backend.gateway.delivery import start_message
from backend.models import AgentCommand
from backend.scheduling.service import start_payload
from backend.spec import DEFAULT_CPU, parse_spec, stored_footprint, stored_spec
from tests.lifecycle.world import World


def _start(spec: dict[str, object]) -> tuple[bool, float | None, float]:
    """What the machine is told: whether it limits the worker's CPU, to what, and its share."""
    payload = start_payload(parse_spec({"name": "r", "command": ["true"], **spec}), 1)
    message = start_message(AgentCommand(worker_name="r-0", payload=payload))
    limited = message.HasField("cpu")
    return limited, message.cpu if limited else None, message.cpu_request


def test_no_cpu_reserves_a_tenth_of_a_core_and_limits_nothing() -> None:
    spec = parse_spec({"name": "r", "command": ["true"]})
    assert (spec.cpu, spec.cpu_reserved, spec.footprint.cpu) == (None, 0.1, 0.1)
    assert DEFAULT_CPU == 0.1
    assert _start({}) == (False, None, 0.1)
    # as stored, and as a scheduling pass reads the stored spec's field (absent: None)
    assert stored_spec(spec.to_json()).cpu_reserved == 0.1
    assert stored_footprint(None, None, None, 0, None, None).cpu == 0.1


def test_a_cpu_given_is_reserved_and_limited_exactly() -> None:
    spec = parse_spec({"name": "r", "command": ["true"], "cpu": 1.5})
    assert (spec.cpu, spec.footprint.cpu) == (1.5, 1.5)
    assert _start({"cpu": 1.5}) == (True, 1.5, 1.5)
    assert stored_footprint(1.5, None, None, 0, None, None).cpu == 1.5
    # a run stored before the default changed said 1 core: it keeps it
    assert stored_spec({"name": "old", "command": ["true"], "cpu": 1.0}).cpu_reserved == 1.0


async def test_two_gangs_of_two_without_cpu_share_a_two_core_laptop(world: World) -> None:
    await world.machine("laptop", gpus=8, cpu=2)
    for name in ("first", "second"):  # cpu not given (run_spec's own default is 4 cores)
        await world.submit(name=name, workers=2, gpus=1, cpu=None, memory_bytes=None)
    await world.submit(name="third", workers=2, gpus=1, cpu=1, memory_bytes=None)
    result = await world.schedule()
    assert sorted(result.placed) == ["first", "second"]  # 0.4 of 2 cores reserved
    assert result.reasons["third"] == (  # 1.6 cores left: one of its workers
        "Gang cannot be placed whole: room for 1 of 2 workers of 1 GPU, 1 core"
    )
