"""Issue 33's scheduling targets on the CPU deployment, measured through the real server and its OpenAI API.

    .venv/bin/python bench/scheduling.py                                   # this checkout, 1 round
    git worktree add /tmp/old-h8 e488561
    .venv/bin/python bench/scheduling.py --code old=/tmp/old-h8 --rounds 2 # before/after, alternating

Each checkout is served as `make serve` serves it (`trtllm-triton serve` on its own model_repository: the embedded
SmolLM2 on CPU, its OpenAI frontend; defaults: max_batch_size 32, max_num_tokens 2048, a 1 GiB KV pool, the
frontend's max_tokens default of min(max_output_len 4096, context left)), on free loopback ports, from the
checkout's directory so that every process imports that checkout's trtllm_model. All servers stay up together and
the measurements alternate between them, so each sees the same moments of a shared machine. Two measurements:

  chats   `--chats` chat completions sent at once, max_tokens unset. Recorded per stream: time to first token and
          when it ended (if it did on its own). "Running at once" = the most streams that had their first token and
          had not ended at one moment (client side), and the largest `nv_trt_llm_request_metrics{request_type=
          "active"}` seen on /metrics meanwhile. Streams are cancelled `--hold-s` after the last first token, or
          `--chat-window-s` after the send. Target: all 32 at once (lifetime reservations of prompt + 4096 tokens
          let about 5 run).
  long    `--streams` completions decoding (random token prompts, `--stream-tokens` each, ignore_eos), then a
          `--long-prompt`-token prompt (random tokens: no prefix-cache hit). Recorded: its time to first token, and
          per running stream the largest gap between its responses while the long prompt waited or prefilled (from
          its send to its first token) over the stream's median gap in the `--baseline-s` before. Targets: TTFT
          <= 2 s, no stream's gap over 3x its median. A checkout that cannot start the prompt beside the streams
          (e488561: max_num_tokens - decoding rows < prompt) would start it when they end: after `--long-wait-s`
          the streams are cancelled, and the time from then to its first token is recorded instead. Then the same
          length of prompt alone on the idle server: the prefill's own time on this machine.

`--param KEY=VALUE` sets a tensorrt_llm parameter on every server (e.g. max_num_tokens=128: the step's token budget,
hence the prefill chunk). Results: a table on stdout and bench/results/scheduling-<time>.json (each chat's TTFT).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(BENCH_DIR))
from conftest import Server, start_server, write_repository  # noqa: E402
from openai import SseConnection, wait_idle  # noqa: E402  (bench/openai.py)
from openai_server import wait_for_frontend  # noqa: E402
from prometheus_text import scrape  # noqa: E402

from trtllm_model.server import ADMIN_KEY_ENV, free_ports  # noqa: E402

RESULTS = BENCH_DIR / "results"
MODEL = "tensorrt_llm"
VOCAB = 49152  # SmolLM2's
TOPICS = ["a lighthouse keeper", "the history of tea", "a robot learning to paint", "the Roman aqueducts",
          "a trip to Mars", "how bees make honey", "a dragon who bakes bread", "the invention of printing",
          "a city under the sea", "the life of a tree", "chess strategy", "a detective in Paris",
          "volcanoes", "the first computers", "a cat who runs a hotel", "winter in Norway"]


class Stream:
    """One streamed request's client-side times (monotonic seconds)."""

    def __init__(self, path: str, body: dict) -> None:
        self.path, self.body = path, body
        self.sent = 0.0
        self.arrivals: list[float] = []  # responses carrying text
        self.ended: float | None = None  # ended on its own (final response)
        self.error: str | None = None

    async def run(self, host: str, port: int) -> None:
        connection = SseConnection(host, port)
        try:
            await connection.open()
            self.sent = time.monotonic()
            async for event in connection.post(self.path, self.body):
                choice = (event.get("choices") or [{}])[0]
                if choice.get("text") or (choice.get("delta") or {}).get("content"):
                    self.arrivals.append(time.monotonic())
            self.ended = time.monotonic()
        except asyncio.CancelledError:
            pass  # the bench stops it: closing the connection cancels the request
        except Exception as exc:  # noqa: BLE001 - recorded and reported
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            await connection.close()

    @property
    def first(self) -> float | None:
        return self.arrivals[0] if self.arrivals else None


class ActiveGauge:
    """Samples the engine's active-requests gauge on a thread until stopped; keeps the largest value."""

    def __init__(self, metrics_url: str, period_s: float = 0.25) -> None:
        self.metrics_url, self.period_s = metrics_url, period_s
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> ActiveGauge:
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                found = scrape(self.metrics_url).find("nv_trt_llm_request_metrics", request_type="active", model=MODEL)
            except OSError:
                continue
            self.peak = max([self.peak, *found.values()])


async def _cancel(tasks: list[asyncio.Task]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def most_running_at_once(streams: list[Stream]) -> int:
    """The most streams that had their first token and had not ended, at any one moment."""
    events = sorted([(s.first, 1) for s in streams if s.first] + [(s.ended, -1) for s in streams if s.first and s.ended])
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return peak


async def chats(port: int, metrics_url: str, count: int, window_s: float, hold_s: float) -> dict:
    streams = [Stream("/v1/chat/completions", {
        "model": MODEL, "stream": True,
        "messages": [{"role": "user", "content": f"Write a long, detailed story about {TOPICS[i % len(TOPICS)]}"
                                                 f"{' and its neighbours' if i >= len(TOPICS) else ''}."}]})
        for i in range(count)]
    with ActiveGauge(metrics_url) as gauge:
        tasks = [asyncio.create_task(s.run("127.0.0.1", port)) for s in streams]
        started = time.monotonic()
        while time.monotonic() - started < window_s and not all(s.first or s.ended or s.error for s in streams):
            await asyncio.sleep(0.05)
        await asyncio.sleep(hold_s)
        await _cancel(tasks)
    ttft = [s.first - s.sent for s in streams if s.first]
    return {
        "streams": count,
        "got_first_token": len(ttft),
        "running_at_once": most_running_at_once(streams),
        "engine_active_peak": gauge.peak,
        "ended_on_their_own": sum(1 for s in streams if s.ended),
        "errors": [s.error for s in streams if s.error],
        "ttft_p50_s": statistics.median(ttft) if ttft else None,
        "ttft_max_s": max(ttft) if ttft else None,
        "ttft_s": [round(s.first - s.sent, 3) if s.first else None for s in streams],
    }


def _random_prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(1000, VOCAB) for _ in range(length)]


async def long_prompt(port: int, streams_n: int, stream_tokens: int, prompt_len: int, baseline_s: float,
                      rng: random.Random, long_wait_s: float, timeout_s: float) -> dict:
    def completion(prompt: list[int], max_tokens: int) -> dict:
        return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}

    running = [Stream("/v1/completions", completion(_random_prompt(rng, 32), stream_tokens)) for _ in range(streams_n)]
    tasks = [asyncio.create_task(s.run("127.0.0.1", port)) for s in running]
    deadline = time.monotonic() + timeout_s
    while not all(s.first or s.error for s in running) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(baseline_s)
    long = Stream("/v1/completions", completion(_random_prompt(rng, prompt_len), 4))
    long_task = asyncio.create_task(long.run("127.0.0.1", port))
    wait_until = time.monotonic() + long_wait_s
    while not (long.first or long.error) and time.monotonic() < wait_until:
        await asyncio.sleep(0.01)
    gave_up = None
    if not long.first:  # it waits for the streams to end (e488561): stop them, see whether it starts then
        gave_up = time.monotonic()
        await _cancel(tasks)
        deadline = time.monotonic() + timeout_s
        while not (long.first or long.error) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    await asyncio.sleep(1.0)
    await _cancel([*tasks, long_task])
    start, end = long.sent, gave_up or long.first or time.monotonic()
    ratios, all_during, worst = [], [], None
    for stream in running:
        pairs = list(zip(stream.arrivals, stream.arrivals[1:]))
        gaps = [(a, b) for a, b in pairs if b > start and a < end]
        before = [b - a for a, b in pairs if start - baseline_s <= a and b <= start]
        if stream.arrivals and stream.arrivals[-1] < end:  # still waiting at the end (then cancelled): a gap too
            gaps.append((stream.arrivals[-1], end))
        during = [b - a for a, b in gaps]
        if before and during:
            ratios.append((statistics.median(before), max(during)))
            all_during += during
            longest = max(gaps, key=lambda gap: gap[1] - gap[0])
            if worst is None or longest[1] - longest[0] > worst[1] - worst[0]:
                worst = longest
    return {
        "streams": streams_n,
        "errors": [s.error for s in [*running, long] if s.error],
        "long_ttft_s": (long.first - long.sent) if long.first and not gave_up else None,
        # Not started within long_wait_s beside the streams; then its first token came this long after they were
        # cancelled (None: not even then).
        "long_first_after_cancel_s": (long.first - gave_up) if gave_up and long.first else None,
        "streams_ended_before_long_first": sum(1 for s in running if s.ended and s.ended <= end),
        "median_gap_before_s": statistics.median(m for m, _ in ratios) if ratios else None,
        "worst_gap_during_s": max(g for _, g in ratios) if ratios else None,
        "median_gap_during_s": statistics.median(all_during) if all_during else None,  # a spike, or every step?
        "worst_gap_ratio": max(g / m for m, g in ratios) if ratios else None,
        "median_gap_ratio": statistics.median(g / m for m, g in ratios) if ratios else None,
        "streams_over_3x": sum(1 for m, g in ratios if g > 3 * m),
        "streams_with_gaps": len(ratios),
        # Where the worst gap lay, in seconds from the long prompt's send (its first token: long_ttft_s).
        "worst_gap_from_to_s": [worst[0] - start, worst[1] - start] if worst else None,
    }


async def prompt_alone(port: int, prompt_len: int, rng: random.Random, timeout_s: float) -> float | None:
    """Time to first token of a `prompt_len`-token prompt on an idle server: the prefill's floor on this machine
    (None: no token within `timeout_s`)."""
    alone = Stream("/v1/completions", {"model": MODEL, "prompt": _random_prompt(rng, prompt_len), "max_tokens": 1,
                                       "stream": True})
    task = asyncio.create_task(alone.run("127.0.0.1", port))
    deadline = time.monotonic() + timeout_s
    while not (alone.first or alone.ended or alone.error) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    await _cancel([task])
    return (alone.first - alone.sent) if alone.first else None


def start(label: str, tree: Path, workdir: Path, parameters: dict[str, str]) -> tuple[Server, int]:
    """`trtllm-triton serve` on the tree's own repository (a copy with `parameters` set on tensorrt_llm, if any),
    from the tree (its trtllm_model first on sys.path)."""
    (openai_port,) = free_ports(1)
    repository = tree / "model_repository"
    if parameters:
        models = tuple(path.name for path in repository.iterdir() if (path / "config.pbtxt").exists())
        repository = write_repository(workdir / label / "repository", parameters, models, source=repository)
    server = start_server(workdir / label, executor=None, repository=repository, cwd=tree,
                          env={"PYTHONPATH": str(tree), ADMIN_KEY_ENV: ""}, openai_port=openai_port)
    try:
        wait_for_frontend(f"http://127.0.0.1:{openai_port}/v1", server)
    except Exception:
        server.stop()
        raise
    return server, openai_port


def _fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def print_table(runs: list[dict]) -> None:
    print(f"\n{'code':<6} {'round':>5} | {'chats: 1st tok':>14} {'at once':>7} {'gauge':>5} {'TTFT p50/max s':>15} | "
          f"{'long TTFT s':>11} {'gap x med (worst/median)':>25} {'>3x':>5} {'med gap':>7} {'alone s':>7}")
    for run in runs:
        c, lp = run["chats"], run["long"]
        ttft = _fmt(lp["long_ttft_s"]) if lp["long_ttft_s"] is not None else f">{run['long_wait_s']:.0f}"
        print(f"{run['code']:<6} {run['round']:>5} | {c['got_first_token']:>10}/{c['streams']:<3} "
              f"{c['running_at_once']:>7} {c['engine_active_peak']:>5.0f} "
              f"{_fmt(c['ttft_p50_s']):>7}/{_fmt(c['ttft_max_s']):<7} | {ttft:>11} "
              f"{_fmt(lp['worst_gap_ratio'], 1):>12}/{_fmt(lp['median_gap_ratio'], 1):<12} "
              f"{lp['streams_over_3x']:>2}/{lp['streams_with_gaps']:<2} {_fmt(lp['median_gap_before_s']):>7} "
              f"{_fmt(lp['alone_ttft_s']):>7}")
    print("targets: chats 32/32 at once; long TTFT <= 2 s; no stream's gap over 3x its median (>3x column 0)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--code", action="append", default=[], metavar="LABEL=TREE",
                        help="another checkout to serve and compare (this one is 'new')")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="a tensorrt_llm config parameter for every server (e.g. max_num_tokens=256)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--chats", type=int, default=32)
    parser.add_argument("--chat-window-s", type=float, default=60.0)
    parser.add_argument("--hold-s", type=float, default=3.0)
    parser.add_argument("--streams", type=int, default=16)
    # 16 x (32 + 1,000) tokens and the long prompt fit e488561's lifetime reservations in the 1 GiB pool (1,456 blocks)
    parser.add_argument("--stream-tokens", type=int, default=1000)
    parser.add_argument("--long-prompt", type=int, default=2048)
    parser.add_argument("--baseline-s", type=float, default=5.0)
    parser.add_argument("--long-wait-s", type=float, default=30.0,
                        help="how long the long prompt may wait beside the streams before they are cancelled")
    parser.add_argument("--long-timeout-s", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=33)
    parser.add_argument("--skip-chats", action="store_true")
    args = parser.parse_args()

    trees = {"new": ROOT, **{label: Path(tree).resolve() for label, tree in (c.split("=", 1) for c in args.code)}}
    rng = random.Random(args.seed)
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-scheduling-") as tmp:
        parameters = dict(p.split("=", 1) for p in args.param)
        servers = {label: start(label, tree, Path(tmp), parameters) for label, tree in trees.items()}
        try:
            for round_ in range(args.rounds):
                order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
                for label in order:
                    server, port = servers[label]
                    run = {"code": label, "tree": str(trees[label]), "round": round_, "long_wait_s": args.long_wait_s}
                    wait_idle(server.metrics_url, 120)
                    run["chats"] = {"got_first_token": 0, "streams": 0, "running_at_once": 0,
                                    "engine_active_peak": 0.0, "ttft_p50_s": None, "ttft_max_s": None} \
                        if args.skip_chats else asyncio.run(
                            chats(port, server.metrics_url, args.chats, args.chat_window_s, args.hold_s))
                    wait_idle(server.metrics_url, 120)
                    run["long"] = asyncio.run(long_prompt(port, args.streams, args.stream_tokens, args.long_prompt,
                                                          args.baseline_s, rng, args.long_wait_s,
                                                          args.long_timeout_s))
                    wait_idle(server.metrics_url, 120)
                    run["long"]["alone_ttft_s"] = asyncio.run(prompt_alone(port, args.long_prompt, rng,
                                                                             args.long_timeout_s))
                    print(json.dumps({k: v for k, v in run.items() if k != "tree"}), flush=True)
                    runs.append(run)
        finally:
            for server, _ in servers.values():
                server.stop()
    print_table(runs)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"scheduling-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"args": vars(args), "runs": runs}, indent=1))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
