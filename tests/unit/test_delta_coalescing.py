"""Text delta coalescing on the runner (omnigent_runner.coalesce and its use in a turn).

The coalescer's rules are checked against a fake clock, so no test waits for real time.
The turn tests replace the model call with a scripted one and check what watchers see:
the same text, in the same order relative to every other event, in fewer events.
"""

from __future__ import annotations

import asyncio
import base64
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from omnigent_runner import protocol, turn
from omnigent_runner.__main__ import build_executor
from omnigent_runner.bundles import build_bundle, parse_bundle
from omnigent_runner.coalesce import DeltaCoalescer
from omnigent_runner.config import RunnerConfig
from omnigent_runner.llm import ClientPool, LLMError, ModelAnswer, ModelRequest
from omnigent_runner.turn import SessionState, TurnRequest, TurnRunner

pytestmark = pytest.mark.timeout(30)

INTERVAL = 0.04
DEADLINE_S = 5.0


# --- the coalescer against a fake clock ---------------------------------------------------


@dataclass
class FakeTimer:
    when: float
    callback: Callable[[], object]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """A clock that moves only when told, running the timers that fall due."""

    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[FakeTimer] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[[], object], /) -> FakeTimer:
        timer = FakeTimer(self.now + delay, callback)
        self.timers.append(timer)
        return timer

    def advance(self, seconds: float) -> None:
        target = self.now + seconds
        while True:
            due = [t for t in self.timers if not t.cancelled and t.when <= target]
            if not due:
                break
            timer = min(due, key=lambda t: t.when)
            self.timers.remove(timer)
            self.now = max(self.now, timer.when)
            timer.callback()
        self.now = target

    def live_timers(self) -> list[FakeTimer]:
        return [t for t in self.timers if not t.cancelled]


@pytest.fixture
def loop() -> FakeLoop:
    return FakeLoop()


@pytest.fixture
def sent() -> list[tuple[str, str]]:
    return []


@pytest.fixture
def coalescer(loop: FakeLoop, sent: list[tuple[str, str]]) -> DeltaCoalescer:
    return DeltaCoalescer(
        send=lambda item_id, text: sent.append((item_id, text)),
        interval_s=INTERVAL,
        scheduler=loop,
    )


def test_first_delta_is_sent_at_once(coalescer, sent, loop) -> None:
    coalescer.add("item_a", "Hello")
    assert sent == [("item_a", "Hello")]
    assert loop.live_timers() == []


def test_a_burst_within_the_interval_is_one_event_after_it(coalescer, sent, loop) -> None:
    coalescer.add("item_a", "The")
    for word in (" quick", " brown", " fox"):
        loop.advance(0.005)
        coalescer.add("item_a", word)
    assert sent == [("item_a", "The")]
    assert coalescer.pending

    loop.advance(INTERVAL - 0.015 - 0.001)  # just short of the interval since "The"
    assert sent == [("item_a", "The")]
    loop.advance(0.002)
    assert sent == [("item_a", "The"), ("item_a", " quick brown fox")]
    assert not coalescer.pending and loop.live_timers() == []


def test_at_most_one_event_per_item_per_interval(sent, loop) -> None:
    sent_at: list[float] = []

    def send(item_id: str, text: str) -> None:
        sent.append((item_id, text))
        sent_at.append(loop.now)

    coalescer = DeltaCoalescer(send=send, interval_s=INTERVAL, scheduler=loop)
    text = [f"t{i} " for i in range(200)]
    for token in text:
        coalescer.add("item_a", token)
        loop.advance(0.003)
    loop.advance(INTERVAL)
    assert "".join(t for _, t in sent) == "".join(text)
    gaps = [b - a for a, b in zip(sent_at, sent_at[1:], strict=False)]
    assert all(gap >= INTERVAL - 1e-9 for gap in gaps)
    assert len(sent) <= 200 * 0.003 / INTERVAL + 2


def test_after_a_quiet_interval_the_next_delta_goes_at_once(coalescer, sent, loop) -> None:
    coalescer.add("item_a", "one")
    loop.advance(INTERVAL * 2)
    coalescer.add("item_a", " two")
    assert sent == [("item_a", "one"), ("item_a", " two")]
    assert loop.live_timers() == []


def test_a_late_timer_does_not_delay_a_due_delta(coalescer, sent, loop) -> None:
    """A busy loop runs the timer late: the next delta takes the buffer with it."""
    coalescer.add("item_a", "a")
    loop.now += 0.01
    coalescer.add("item_a", "b")  # buffered, timer due at +INTERVAL
    loop.now += INTERVAL  # the timer has not run yet
    coalescer.add("item_a", "c")
    assert sent == [("item_a", "a"), ("item_a", "bc")]
    assert loop.live_timers() == []


def test_two_items_interleaved_are_coalesced_each_on_its_own(coalescer, sent, loop) -> None:
    coalescer.add("item_a", "A1")
    coalescer.add("item_b", "B1")
    for part in ("2", "3"):
        loop.advance(0.005)
        coalescer.add("item_a", "A" + part)
        coalescer.add("item_b", "B" + part)
    assert sent == [("item_a", "A1"), ("item_b", "B1")]
    loop.advance(INTERVAL)
    assert sent[2:] == [("item_a", "A2A3"), ("item_b", "B2B3")]
    assert loop.live_timers() == []


def test_flush_sends_now_and_cancels_the_timer(coalescer, sent, loop) -> None:
    coalescer.add("item_a", "a")
    coalescer.add("item_a", "b")
    coalescer.add("item_b", "x")
    coalescer.add("item_b", "y")
    (timer_a, timer_b) = loop.live_timers()
    coalescer.flush()
    assert sent == [("item_a", "a"), ("item_b", "x"), ("item_a", "b"), ("item_b", "y")]
    assert timer_a.cancelled and timer_b.cancelled
    loop.advance(INTERVAL * 10)
    assert len(sent) == 4  # no extra event later
    coalescer.flush()
    assert len(sent) == 4  # nothing buffered: nothing sent


def test_the_concatenation_is_the_input_exactly(coalescer, sent, loop) -> None:
    rng = random.Random(1414)
    alphabet = ["é", "e\u0301", "😀", "👩‍💻", "中文", " ", "\n", "\t", "a", "\\", '"', "", "\u200b"]
    chunks = ["".join(rng.choices(alphabet, k=rng.randint(0, 4))) for _ in range(500)]
    for chunk in chunks:
        coalescer.add("item_a", chunk)
        loop.advance(rng.choice([0.0, 0.001, 0.01, 0.05]))
    coalescer.flush()
    assert "".join(text for _, text in sent) == "".join(chunks)
    assert all(text for _, text in sent)  # empty strings are never sent
    assert len(sent) < len([c for c in chunks if c])


def test_empty_deltas_are_ignored(coalescer, sent, loop) -> None:
    coalescer.add("item_a", "")
    assert sent == [] and loop.live_timers() == []
    coalescer.add("item_a", "x")
    coalescer.add("item_a", "")
    assert sent == [("item_a", "x")] and loop.live_timers() == []


def test_interval_zero_passes_every_delta(sent) -> None:
    off = DeltaCoalescer(send=lambda i, t: sent.append((i, t)), interval_s=0)  # no loop needed
    for token in ("a", "", "b", "c"):
        off.add("item_a", token)
    assert sent == [("item_a", "a"), ("item_a", "b"), ("item_a", "c")]
    assert not off.pending


def test_a_large_buffer_is_sent_before_the_interval(loop, sent) -> None:
    small = DeltaCoalescer(
        send=lambda i, t: sent.append((i, t)), interval_s=INTERVAL, max_chars=10, scheduler=loop
    )
    small.add("item_a", "first")
    small.add("item_a", "12345")
    small.add("item_a", "67890")
    assert sent == [("item_a", "first"), ("item_a", "1234567890")]
    assert loop.live_timers() == []


def test_bad_arguments_are_refused(sent) -> None:
    with pytest.raises(ValueError):
        DeltaCoalescer(send=lambda i, t: None, interval_s=-0.001)
    with pytest.raises(ValueError):
        DeltaCoalescer(send=lambda i, t: None, interval_s=0.04, max_chars=0)


# --- in a turn: the order watchers see ---------------------------------------------------

Script = Callable[[Callable[[str], None]], Any]  # async (on_delta) -> ModelAnswer


def _spec() -> Any:
    yaml_text = "name: t\nprompt: p\nexecutor:\n  model: m\n  timeout: 30\n"
    return parse_bundle(build_bundle({"agent.yaml": yaml_text})).spec


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Script]]:
    """Replace the model call: each call runs the next scripted coroutine function."""
    scripts: list[Script] = []

    async def fake_call_model(
        client: Any, request: ModelRequest, on_delta: Callable[[str], None], usage: Any = None
    ) -> ModelAnswer:
        answer: ModelAnswer = await scripts.pop(0)(on_delta)
        return answer

    monkeypatch.setattr(turn, "call_model", fake_call_model)
    yield scripts


class Recorder:
    def __init__(self) -> None:
        self.events: list[protocol.AnyEvent] = []
        self.changed = asyncio.Event()

    def __call__(self, event: protocol.AnyEvent) -> None:
        self.events.append(event)
        self.changed.set()

    def kinds(self) -> list[str]:
        return [protocol.frame_type(e) for e in self.events]

    def deltas(self) -> list[str]:
        return [e.delta for e in self.events if isinstance(e, protocol.OutputTextDelta)]

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        async def scan() -> None:
            while not predicate():
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(scan(), DEADLINE_S)


@pytest.fixture
async def make_turn() -> Any:
    pools: list[ClientPool] = []

    def factory(interval_s: float) -> tuple[TurnRunner, Recorder, SessionState]:
        session = SessionState(
            session_id="sess_1", spec=_spec(), load_error=None, history=[], root=None, tracker=None
        )
        recorder = Recorder()
        pool = ClientPool(max_retries=0)
        pools.append(pool)
        runner = TurnRunner(
            session,
            TurnRequest("resp_1", [], []),
            emit=recorder,
            pool=pool,
            env={},
            delta_interval_s=interval_s,
        )
        return runner, recorder, session

    yield factory
    for pool in pools:
        await pool.aclose()


def _tokens(*tokens: str, text: str | None = None) -> Script:
    async def run(on_delta: Callable[[str], None]) -> ModelAnswer:
        for token in tokens:
            on_delta(token)
        return ModelAnswer(text="".join(tokens) if text is None else text)

    return run


async def test_buffered_text_goes_before_the_item_done_and_the_turn_end(make_turn, script) -> None:
    script.append(_tokens("Hel", "lo", "", " wor", "ld"))
    runner, recorder, _ = make_turn(interval_s=30.0)  # no timer can fire in this test
    await runner.run()
    assert recorder.kinds() == [
        "session.status",
        "response.created",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_item.done",
        "response.completed",
        "session.status",
    ]
    assert recorder.deltas() == ["Hel", "lo world"]
    done = next(e for e in recorder.events if isinstance(e, protocol.OutputItemDone))
    assert done.item["content"][0]["text"] == "Hello world"
    assert not runner._deltas.pending


async def test_the_timer_sends_a_burst_as_one_event_while_the_model_streams(
    make_turn, script
) -> None:
    recorder_box: list[Recorder] = []

    async def stream(on_delta: Callable[[str], None]) -> ModelAnswer:
        on_delta("a")
        on_delta("b")
        on_delta("c")
        recorder = recorder_box[0]
        await recorder.wait_for(lambda: len(recorder.deltas()) == 2)  # the timer's event
        on_delta("d")
        return ModelAnswer(text="abcd")

    script.append(stream)
    runner, recorder, _ = make_turn(interval_s=0.01)
    recorder_box.append(recorder)
    await runner.run()
    assert recorder.deltas()[:2] == ["a", "bc"]
    assert "".join(recorder.deltas()) == "abcd"
    kinds = recorder.kinds()
    last_delta = max(i for i, k in enumerate(kinds) if k == "response.output_text.delta")
    assert last_delta < kinds.index("response.output_item.done")


async def test_interval_zero_sends_every_token_in_a_turn(make_turn, script) -> None:
    script.append(_tokens("a", "b", "c"))
    runner, recorder, _ = make_turn(interval_s=0)
    await runner.run()
    assert recorder.deltas() == ["a", "b", "c"]


async def _start_hanging(make_turn, script, interval_s: float) -> tuple[Any, ...]:
    """A turn whose model streamed "a", "b", "c" and then hangs (until cancelled)."""
    streamed = asyncio.Event()

    async def hang(on_delta: Callable[[str], None]) -> ModelAnswer:
        for token in ("a", "b", "c"):
            on_delta(token)
        streamed.set()
        await asyncio.Event().wait()
        raise AssertionError("not reached")

    script.append(hang)
    runner, recorder, session = make_turn(interval_s=interval_s)
    task = asyncio.create_task(runner.run())
    await asyncio.wait_for(streamed.wait(), DEADLINE_S)
    return runner, recorder, session, task


async def test_an_interrupt_sends_the_buffered_text_before_the_cancellation(
    make_turn, script
) -> None:
    runner, recorder, _, task = await _start_hanging(make_turn, script, 30.0)
    assert recorder.deltas() == ["a"]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, DEADLINE_S)
    assert recorder.kinds()[2:] == [
        "response.output_text.delta",
        "response.output_text.delta",
        "response.cancelled",
        "session.status",
    ]
    assert recorder.deltas() == ["a", "bc"]
    assert not runner._deltas.pending


async def test_a_failure_sends_the_buffered_text_before_the_failure(make_turn, script) -> None:
    async def fail(on_delta: Callable[[str], None]) -> ModelAnswer:
        on_delta("par")
        on_delta("tial")
        raise LLMError("llm_error", "the stream broke")

    script.append(fail)
    runner, recorder, _ = make_turn(interval_s=30.0)
    await runner.run()
    # The streamed text is also kept as an incomplete item (issue 44), after its deltas.
    assert recorder.kinds()[2:] == [
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_item.done",
        "response.failed",
        "session.status",
    ]
    assert recorder.deltas() == ["par", "tial"]


async def test_a_closing_session_sends_nothing_more(make_turn, script) -> None:
    runner, recorder, session, task = await _start_hanging(make_turn, script, 30.0)
    before = list(recorder.events)
    session.closing = True
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, DEADLINE_S)
    assert recorder.events == before  # the buffered "bc" is dropped, as every event is
    assert recorder.deltas() == ["a"]
    assert not runner._deltas.pending


async def test_a_timer_due_while_closing_sends_nothing(make_turn, script) -> None:
    runner, recorder, session, task = await _start_hanging(make_turn, script, 0.001)
    session.closing = True
    await asyncio.sleep(0.01)  # past the interval: the timer has run
    assert recorder.deltas() == ["a"] and not runner._deltas.pending
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, DEADLINE_S)


async def test_any_other_event_flushes_first(make_turn, script) -> None:
    """Status, approval and policy events take the same path (``_emit``) as item done."""
    runner, recorder, _, task = await _start_hanging(make_turn, script, 30.0)
    runner._status("waiting")
    runner._emit(
        protocol.PolicyDenied(
            response_id="resp_1", call_id="call_1", tool="t", policy_name="p", reason="r"
        )
    )
    runner._delta("other", "x")
    runner._delta("other", "y")
    runner._emit(protocol.workspace_changes({"mode": "agent_edit", "entries": []}))
    assert recorder.kinds()[2:] == [
        "response.output_text.delta",  # a
        "response.output_text.delta",  # bc
        "session.status",
        "policy.denied",
        "response.output_text.delta",  # x
        "response.output_text.delta",  # y
        "workspace.changes",
    ]
    assert recorder.deltas() == ["a", "bc", "x", "y"]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, DEADLINE_S)


# --- the setting reaches the turns ---------------------------------------------------------


class Sink:
    def __init__(self) -> None:
        self.recorder = Recorder()

    def emit(self, session_id: str, event: protocol.AnyEvent) -> None:
        self.recorder(event)


@pytest.mark.parametrize(("interval_ms", "expected"), [(0, ["a", "b", "c"]), (1000, ["a", "bc"])])
async def test_the_configured_interval_reaches_the_turns(
    tmp_path, script, interval_ms: int, expected: list[str]
) -> None:
    config = RunnerConfig(
        server_url="http://127.0.0.1:8000",
        token="t",
        runner_id="runner_token_x",
        workspace=tmp_path,
        delta_interval_ms=interval_ms,
    )
    executor = build_executor(config)
    sink = Sink()
    executor.bind(sink)
    yaml_text = "name: t\nprompt: p\nexecutor:\n  model: m\n"
    bundle = base64.b64encode(build_bundle({"agent.yaml": yaml_text})).decode()
    script.append(_tokens("a", "b", "c"))
    try:
        await executor.open_session(
            session_id="sess_1",
            agent=protocol.AgentRef(id="agent_1", version=1, bundle_b64=bundle),
            history=[],
        )
        await executor.start_turn(session_id="sess_1", response_id="resp_1", input=[], tools=[])
        await sink.recorder.wait_for(lambda: "response.completed" in sink.recorder.kinds())
    finally:
        await executor.shutdown()
    assert sink.recorder.deltas() == expected
