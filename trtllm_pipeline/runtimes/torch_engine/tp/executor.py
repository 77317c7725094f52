"""The leader's side of a tensor-parallel group: rank 0, inside ``TorchRuntime``, with N-1 workers.

``TorchRuntime`` keeps the scheduler (admission, batching, sampling); each executor call becomes a
command broadcast to the workers (``comm``: a header tensor and a payload tensor, no pickles), after
which every rank, this one included, runs its shard (``sharded_model.run_command``) and rank 0 gets
the result. Only rank 0 samples: the logits are gathered to it, and the tokens it picks reach the
workers as the next step's input ids, so no random state has to agree across processes.

Failure detection, so that nothing hangs:

* a monitor thread polls the workers (``POLL_S``); when one exits or is stopped it names it (exit
  code or signal, and the tail of its log) and kills the others, so a collective in flight fails at once instead of
  waiting for its timeout;
* every collective has a timeout (``COLLECTIVE_TIMEOUT_S``): a worker alive but not answering fails
  the call; an idle group is pinged every ``HEARTBEAT_S`` (the workers' own wait for the next
  command has that timeout too, and a hung worker shows between requests);
* from the first failure on, every call raises ``ExecutorLost`` with that message; the runtime turns
  it into an error for each request in flight and for each new one.
"""

from __future__ import annotations

import atexit
import datetime
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trtllm_pipeline.runtimes.torch_engine.executor import (Executor, ExecutorLost, device_free_bytes, rank_stats,
                                                             rss_bytes)
from trtllm_pipeline.runtimes.torch_engine.tp import comm as wire
from trtllm_pipeline.runtimes.torch_engine.tp import launcher
from trtllm_pipeline.runtimes.torch_engine.plan import decode_inputs
from trtllm_pipeline.runtimes.torch_engine.tp.sharded_model import load_shard, run_command

log = logging.getLogger(__name__)

COLLECTIVE_TIMEOUT_S = 30.0  # a rank silent this long fails the call (a dead one fails it at once)
LOAD_TIMEOUT_S = 900.0  # workers loading their shards (a 7B shard from a cold disk)
HEARTBEAT_S = 5.0  # an idle group is pinged this often
POLL_S = 0.1  # how often the monitor looks at the workers
STOP_WAIT_S = 5.0  # a stopped worker's time to exit before it is killed

_LIVE: "weakref.WeakSet[TpExecutor]" = weakref.WeakSet()
FIX = ("restart the command (a served model: `trtllm-pipeline serve --stop`, then serve again); a worker killed "
       "for memory needs a smaller build.max_batch_size / build.max_seq_len, or runtime.tp_mode merged")


class TpExecutor(Executor):
    """Rank 0 of ``world_size``; starts the workers, runs its own shard, and stops them on ``close``."""

    def __init__(self, checkpoint_dir: Path, *, world_size: int, device: torch.device, dtype: torch.dtype | None,
                 max_seq_len: int):
        self.world_size, self.failure = world_size, None
        cuda = device.type == "cuda"
        self.device = torch.device("cuda", 0) if cuda else torch.device("cpu")
        self._lock = threading.Lock()  # one command at a time: the runtime's thread, or the heartbeat
        self._closing = threading.Event()
        self._closed = False
        self._connected = False
        self._last_call = time.monotonic()
        self._procs: list = []
        self._logs = Path(tempfile.mkdtemp(prefix="trtllm-tp-"))
        # The ranks share this machine's cores on CPU: each takes its part, so N processes do not each
        # start a thread per core (restored on close).
        self._threads = torch.get_num_threads()
        per_rank = 0 if cuda else max(1, len(os.sched_getaffinity(0)) // world_size)
        if per_rank:
            torch.set_num_threads(per_rank)
        sock = launcher.listening_socket()
        port = sock.getsockname()[1]
        self._store = dist.TCPStore("127.0.0.1", port, world_size, is_master=True, wait_for_workers=False,
                                    timeout=datetime.timedelta(seconds=LOAD_TIMEOUT_S),
                                    master_listen_fd=sock.detach())  # the store owns the socket now
        argvs = [["--checkpoint", str(checkpoint_dir), "--rank", str(rank), "--world-size", str(world_size),
                  "--port", str(port), "--leader-pid", str(os.getpid()),
                  "--device", f"cuda:{rank}" if cuda else "cpu", "--max-seq-len", str(max_seq_len), "--threads", str(per_rank),
                  "--timeout", str(COLLECTIVE_TIMEOUT_S), "--load-timeout", str(LOAD_TIMEOUT_S)]
                 + (["--dtype", str(dtype).removeprefix("torch.")] if dtype else [])
                 for rank in range(1, world_size)]
        spawned = threading.Event()
        # The workers are started by the monitor thread: PR_SET_PDEATHSIG follows the thread that
        # started a child, and this one lives exactly as long as the group.
        self._monitor = threading.Thread(target=self._watch, args=(argvs, spawned), name="tp-monitor", daemon=True)
        self._monitor.start()
        spawned.wait()
        _LIVE.add(self)
        try:
            self.comm = wire.Comm(0, world_size, self.device, COLLECTIVE_TIMEOUT_S)
            self.engine = load_shard(checkpoint_dir, self.comm, device=self.device, dtype=dtype,
                                     max_seq_len=max_seq_len)
            self._stats = [{**rank_stats(self.engine, 0), "free_bytes": device_free_bytes(self.device)}] + self._wait_ready()
            self.comm.connect(self._store)
            self._connected = True
        except BaseException:
            self.close()
            raise
        self._last_call = time.monotonic()
        log.info("tensor parallel: %d processes (%s), pids %s", world_size,
                 "NCCL, one GPU each" if cuda else "gloo on 127.0.0.1", " ".join(map(str, self.pids)))

    # ---- the executor interface ----------------------------------------------------------------

    def forward(self, batch):
        b, w = batch.block_tables.shape
        return self._call(wire.FORWARD, (b, batch.tokens.shape[0], w), batch.flat())

    def logits(self, hidden):
        rows = hidden.reshape(-1, hidden.shape[-1])
        out = self._call(wire.LOGITS, (rows.shape[0], rows.shape[1], wire.DTYPES.index(rows.dtype)), rows)
        return out.reshape(*hidden.shape[:-1], out.shape[-1])

    def free_memory(self):
        """The least over the ranks, each measured when it had loaded its shard (CUDA: every rank its own GPU)."""
        free = [s.get("free_bytes") for s in self._stats]
        return None if None in free else min(free)

    def allocate_kv(self, num_blocks, block_size):
        self._call(wire.ALLOCATE_KV, (num_blocks, block_size))
        kv = num_blocks * block_size * self.engine.kv_bytes_per_token()  # the ranks' shares are alike
        self._stats = [{**s, "memory": {**s["memory"], "kv_cache": kv}} for s in self._stats]

    def ranks(self) -> list[dict[str, Any]]:
        return [{**s, "rss_bytes": rss_bytes(s["pid"])} for s in self._stats]

    def fast_decoder(self, buckets, use_graphs):
        from trtllm_pipeline.runtimes.torch_engine.cuda.decode_step import DecodeStep  # Triton: where the fast path is asked for

        # Unsupported here, before any rank starts (the ranks' shards are alike); FAST_PREPARE reuses it
        self.engine.fast_step = DecodeStep(self.engine)
        self._call(wire.FAST_PREPARE, (len(buckets), int(use_graphs)),
                   torch.tensor(list(buckets), dtype=torch.long))
        return TpDecoder(self)

    @property
    def pids(self) -> list[int]:
        return [os.getpid()] + [p.pid for p in self._procs]

    def close(self) -> None:
        """Stop the workers (a STOP command, then SIGKILL for any still there after ``STOP_WAIT_S``)."""
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        if self._connected and self.failure is None and self._lock.acquire(timeout=COLLECTIVE_TIMEOUT_S):
            try:
                self.comm.send(wire.STOP)
            except Exception:  # the group is gone already: the kill below is all there is to do
                pass
            finally:
                self._lock.release()
        self._closing.set()
        deadline = time.monotonic() + STOP_WAIT_S
        for proc in self._procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except Exception:
                proc.kill()
                proc.wait()
            if proc.stdin:
                proc.stdin.close()
        self._monitor.join(timeout=2)
        self._store = None
        torch.set_num_threads(self._threads)
        shutil.rmtree(self._logs, ignore_errors=True)

    # ---- commands and failures -------------------------------------------------------------------

    def _call(self, op: int, ints: tuple[int, ...] = (), payload: torch.Tensor | None = None):
        with self._lock:
            if self.failure is not None:
                raise self.failure
            try:
                sent = self.comm.send(op, ints, payload)
                return run_command(self.engine, op, list(ints), sent)
            except Exception as exc:
                raise self._lost(self._cause(op, exc)) from None
            finally:
                self._last_call = time.monotonic()

    def _cause(self, op: int, exc: Exception) -> str:
        """Why a collective failed: a worker that died (given a second to be seen), else the error itself."""
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            if (dead := self._dead_worker()) is not None:
                return dead
            time.sleep(POLL_S / 2)
        if "timed out" in str(exc).lower():
            return (f"a worker did not answer its {wire.OP_NAMES.get(op, 'unknown')} command within "
                    f"{COLLECTIVE_TIMEOUT_S:.0f} s ({exc})")
        return f"its {wire.OP_NAMES.get(op, 'unknown')} command failed: {type(exc).__name__}: {exc}"

    def _dead_worker(self) -> str | None:
        """A worker that exited, or that is stopped (SIGSTOP, a debugger): it would only time the group out."""
        for rank, proc in enumerate(self._procs, start=1):
            code = proc.poll()
            if code is None and launcher.stopped(proc.pid):
                return f"tensor-parallel worker rank {rank} (pid {proc.pid}) is stopped (SIGSTOP or a debugger)"
            if code is not None:
                tail = launcher.log_tail(self._logs / f"rank{rank}.log")
                return (f"tensor-parallel worker rank {rank} (pid {proc.pid}) {launcher.exit_description(code)}"
                        + (f"; its last output:\n{tail}" if tail else ""))
        return None

    def _lost(self, why: str) -> ExecutorLost:
        """Record the first failure and end the group: kill every worker (a collective in flight then
        fails at once, and nothing is left running)."""
        if self.failure is None:
            self.failure = ExecutorLost(f"the tensor-parallel group of {self.world_size} processes stopped: {why}",
                                        fix=FIX)
            log.error("%s", self.failure.message)
            for proc in self._procs:
                if proc.poll() is None:
                    try:
                        proc.send_signal(signal.SIGKILL)
                    except OSError:
                        pass
        return self.failure

    def _wait_ready(self) -> list[dict[str, Any]]:
        """Each worker's ``rank_stats``, once it has loaded its shard; a worker that dies first is named."""
        keys = [f"ready/{rank}" for rank in range(1, self.world_size)]
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while not self._store.check(keys):
            if self.failure is not None:
                raise self.failure
            if (dead := self._dead_worker()) is not None:
                raise self._lost(dead)
            if time.monotonic() > deadline:
                raise self._lost(f"the workers did not load their shards within {LOAD_TIMEOUT_S:.0f} s")
            time.sleep(POLL_S)
        return [json.loads(self._store.get(key)) for key in keys]

    def _watch(self, argvs: list[list[str]], spawned: threading.Event) -> None:
        try:
            self._procs = [launcher.spawn(argv, self._logs / f"rank{rank}.log") for rank, argv in enumerate(argvs, 1)]
        finally:
            spawned.set()
        while not self._closing.wait(POLL_S):
            if self.failure is not None:
                continue  # stay alive until close: the workers are gone already
            if (dead := self._dead_worker()) is not None:
                self._lost(dead)
                continue
            if self._connected and time.monotonic() - self._last_call > HEARTBEAT_S and self._lock.acquire(False):
                try:
                    if self.failure is None and not self._closing.is_set():
                        self.comm.send(wire.PING)
                        run_command(self.engine, wire.PING, [], None)
                except Exception as exc:
                    self._lost(self._cause(wire.PING, exc))
                finally:
                    self._last_call = time.monotonic()
                    self._lock.release()


class TpDecoder:
    """The group's fast decode path, seen from rank 0: each step is one FAST_DECODE command, on which every
    rank replays its own captured step (with the step's collectives inside); rank 0's buffers hold the
    whole logits and the greedy tokens."""

    def __init__(self, executor: TpExecutor):
        self.executor, self.local = executor, executor.engine.fast
        self.buckets, self.use_graphs = self.local.buckets, self.local.use_graphs
        self.setup_seconds = self.local.setup_seconds

    def decode(self, tokens, tables, positions, request_ids=None) -> torch.Tensor:
        """Every row's whole table goes to the ranks each step (each rank rewrites its device copy)."""
        rows = decode_inputs(tokens, tables, positions, len(tokens), self.local.width)
        return self.executor._call(wire.FAST_DECODE, (len(tokens), self.local.width), rows.reshape(-1))

    def release(self, request_ids) -> None:
        """Nothing kept per request: the tables come with each step."""

    def greedy(self, n: int) -> torch.Tensor:
        return self.local.greedy(n)

    def weight_bytes(self) -> int:
        """Over every rank: the shards are alike (heads, features and vocabulary rows split evenly)."""
        return self.local.weight_bytes() * self.executor.world_size


@atexit.register
def _close_all() -> None:
    """Stop the workers of every group still open when the interpreter exits (a CLI that never closed)."""
    for executor in list(_LIVE):
        executor.close()
