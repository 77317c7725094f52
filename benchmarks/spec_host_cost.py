"""Host time per step of the torch runtime outside the model (executor forward + logits), plain vs speculative.

    .venv/bin/python benchmarks/spec_host_cost.py CHECKPOINT_DIR [profile]

CHECKPOINT_DIR: the tiny model's (``tiny-qwen2-bf16-tp1``: ``trtllm-pipeline quantize -c
build_configs/tiny-qwen2-bf16-tp1.yaml``, then ENGINES/tiny-qwen2-bf16-tp1/checkpoint). On CPU, float32, one
thread, batch 1, 128 tokens: the median over 5 runs of each mode of a step's wall time less the model's, then per
phase (us/step); ``profile``: cProfile's callees of the phases. On CPU the verify step's argmax over its 1 + k rows
is counted as host time (on a GPU it is the device's).
"""
import sys, time, statistics, cProfile, pstats
from pathlib import Path
import torch
from trtllm_pipeline.config import SpeculativeSection
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.torch_engine.runtime import TorchRuntime

torch.set_num_threads(1)
ckpt = Path(sys.argv[1])
PASSAGE = list(range(3000, 3060))
# a prompt that repeats, a generated text that (tiny model) doesn't: lookups hit in the prompt a bit
PROMPTS = [PASSAGE * 4 + [7, 8] + PASSAGE[:6]]
rt = TorchRuntime(ckpt, ckpt / "tokenizer", speculative=SpeculativeSection(method="ngram"), max_batch_size=4,
                  max_seq_len=1024, dtype="float32", kv_block_size=16)
model_s = [0.0]
fwd, lg = rt.executor.forward, rt.executor.logits
def timed(fn):
    def w(*a, **k):
        t = time.perf_counter(); r = fn(*a, **k)
        model_s[0] += time.perf_counter() - t; return r
    return w
rt.executor.forward, rt.executor.logits = timed(fwd), timed(lg)

# the tiny model's own text never repeats, so a real lookup rarely hits: the proposer runs the real n-gram lookup
# (its cost counted) and then drafts plain greedy's next tokens, every third wrong (tests/spec_oracle.Oracle), so
# that nearly every step verifies with partial acceptance, rollback and the adaptive length at work
from trtllm_pipeline.runtimes.torch_engine.speculative.proposer import NgramProposer
class OracleNgram(NgramProposer):
    answers = None
    def propose(self, batch):
        found = super().propose(batch)
        if self.answers is None:
            return found
        out = []
        for r in batch:
            at = len(r.generated)
            truth = self.answers[r.request_id][at: at + r.k]
            out.append([t if (at + j) % 3 != 2 else t + 1 for j, t in enumerate(truth)])
        return out
oracle = OracleNgram()
rt.speculator.proposer = oracle

def run(spec, n=128):
    rt.speculator.enabled = spec
    for i, p in enumerate(PROMPTS):
        rt.submit(i, p, SamplingParams(max_tokens=n, end_id=-1))
    host, steps, out = [], 0, {i: [] for i in range(len(PROMPTS))}
    first = True
    while rt.has_work():
        model_s[0] = 0.0
        t = time.perf_counter()
        ev = rt.step()
        dt = time.perf_counter() - t
        if not first:  # (the prefill step apart)
            host.append(dt - model_s[0])
        first = False
        for e in ev:
            out[e.request_id] += e.token_ids
    return host, out

oracle.answers = run(False)[1]
for _ in range(2):
    run(False); run(True)
rows0 = rt.stats().get("spec_decode_verify_rows", 0)
ph, ps = [], []
for _ in range(5):
    h, plain = run(False); ph += h
    h, spec = run(True); ps += h
rows = rt.stats()["spec_decode_verify_rows"] - rows0
print(f"identical {plain == spec}; plain steps {len(ph)//5}, spec steps {len(ps)//5}, verify rows/run {rows/5:.0f}")
print(f"host us/step outside the model: plain median {statistics.median(ph)*1e6:.0f} mean {statistics.mean(ph)*1e6:.0f};"
      f" spec median {statistics.median(ps)*1e6:.0f} mean {statistics.mean(ps)*1e6:.0f}")
import collections
acc = collections.Counter()
def wrap(obj, name, key=None):
    fn = getattr(obj, name)
    def w(*a, **k):
        t = time.perf_counter(); r = fn(*a, **k)
        acc[key or name] += time.perf_counter() - t; return r
    setattr(obj, name, w)
from trtllm_pipeline.runtimes.torch_engine import plan as planmod, runtime as rtmod
for n in ("_propose", "_settle", "_verify", "_record_verified", "_forward", "_split", "_run_eager", "_sample", "_record_all"):
    wrap(rt, n)
wrap(rt.scheduler, "schedule")
wrap(rt.executor, "forward", "executor.forward")
wrap(rt.executor, "logits", "executor.logits")
wrap(rt.speculator, "propose", "speculator.propose")
orig_of = planmod.PagedBatch.of
def of(rows, *a, **k):
    t = time.perf_counter(); r = orig_of(rows, *a, **k); acc["PagedBatch.of"] += time.perf_counter() - t; return r
planmod.PagedBatch.of = staticmethod(of)
for mode in (False, True):
    acc.clear(); n = 0
    for _ in range(5):
        h, _o = run(mode); n += len(h) + 1
    print("spec" if mode else "plain", "us/step by phase:", {k: round(v / n * 1e6) for k, v in sorted(acc.items())})
if len(sys.argv) > 2:
    pr = cProfile.Profile(); pr.enable(); run(True); pr.disable()
    st = pstats.Stats(pr); st.sort_stats("cumtime").print_callees(r"_verify|_settle|_propose|_run_eager|of\b|_sample$")
