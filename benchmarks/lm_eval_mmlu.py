"""This project's MMLU against lm-evaluation-harness's ``mmlu`` task, item by item, on the same weights.

Both sides see the same questions (the subset ``eval --limit N`` selects from the local MMLU
release), the same weights and float32 arithmetic:

* this project: ``trtllm-pipeline eval --tasks mmlu`` on the config's built engine with the torch
  runtime (on a CPU it computes in float32; a BF16 build holds bfloat16 weights);
* lm-eval: ``--model hf`` (``dtype=float32``) on the config's Hugging Face checkpoint with every
  weight rounded to the build's dtype first (so both hold the very same values), 5-shot as this
  project's task, over per-subject task configs made from lm-eval's own installed ``mmlu`` configs
  (``_default_template_yaml``: prompt, choices, first-n dev shots; each subject's description),
  with only the data source changed: the selected questions and the dev split as local JSON
  (``dataset_path: json``) instead of the hub's ``cais/mmlu``. ``--log_samples`` gives its
  log-likelihoods.

It prints the items, the prediction agreement and the largest |ΔLL| over every answer letter, and
writes them (with each item's numbers, the versions and the command) as JSON:

    python benchmarks/lm_eval_mmlu.py -c build_configs/smollm2-135m-instruct-bf16-tp1.yaml \\
        --engines-dir engines --data-dir ../shared/data --limit 57 -o benchmarks/results/lm-eval-mmlu.json

Needs lm-eval (``pip install -e '.[lm-eval]'``) and the config built (``trtllm-pipeline build``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from trtllm_pipeline import artifacts
from trtllm_pipeline.config import load_config
from trtllm_pipeline.eval import evaluate
from trtllm_pipeline.model.source import resolve_model
from trtllm_pipeline.tasks import data, mmlu

LETTERS = data.LETTERS


def rounded_checkpoint(cfg, out: Path) -> Path:
    """The config's HF checkpoint with every weight rounded to the build's dtype, saved in float32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = resolve_model(cfg.model).model_dir
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    dtype = getattr(torch, cfg.dtype)
    with torch.no_grad():
        for tensor in model.state_dict().values():  # tied weights are one tensor: rounded once, equal anyway
            tensor.copy_(tensor.to(dtype).to(torch.float32))
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(source).save_pretrained(out)
    return out


def local_tasks(items: list[dict], data_dir: Path, out: Path) -> dict[str, list[str]]:
    """lm-eval task configs over the selected items: ``{task name: [item ids in doc_id order]}``.

    Each subject's config is lm-eval's installed ``mmlu_<subject>.yaml`` (its description) over its
    ``_default_template_yaml`` (prompt, choices, shots), with the hub dataset replaced by local JSON.
    """
    import lm_eval
    import yaml

    installed = Path(lm_eval.__file__).parent / "tasks" / "mmlu" / "default"
    template = (installed / "_default_template_yaml").read_text()
    if "dataset_path: cais/mmlu" not in template:
        raise SystemExit(f"{installed}: lm-eval's mmlu template changed; check the dataset line by hand")
    (out / "_local_template_yaml").write_text(template.replace("dataset_path: cais/mmlu", "dataset_path: json"))
    test_rows, dev_rows, _ = data.mmlu_rows(data_dir)
    by_id, seen = {}, {}
    for row in test_rows:
        index = seen.get(row["subject"], 0)
        seen[row["subject"]] = index + 1
        by_id[f"{row['subject']}/{index}"] = row
    order: dict[str, list[str]] = {}
    for item in items:
        order.setdefault(item["subject"], []).append(item["id"])
    tasks = {}
    for subject, ids in order.items():
        def rows_file(name: str, rows: list[dict]) -> str:
            path = out / f"{subject}_{name}.jsonl"
            path.write_text("".join(json.dumps({"question": r["question"], "subject": r["subject"],
                                                "choices": r["choices"], "answer": LETTERS.index(r["answer"])})
                                    + "\n" for r in rows))
            return str(path)

        own = yaml.safe_load((installed / f"mmlu_{subject}.yaml").read_text())
        name = f"mmlu_local_{subject}"
        config = {"include": "_local_template_yaml", "task": name, "description": own["description"],
                  "dataset_kwargs": {"data_files": {
                      "test": rows_file("test", [by_id[i] for i in ids]),
                      "dev": rows_file("dev", [r for r in dev_rows if r["subject"] == subject])}}}
        (out / f"{name}.yaml").write_text(yaml.safe_dump(config, allow_unicode=True))
        tasks[name] = ids
    return tasks


def run_lm_eval(checkpoint: Path, tasks: dict[str, list[str]], include: Path, batch_size: int) -> dict[str, list]:
    """``{item id: [(loglikelihood, is_greedy) per letter]}`` from lm-eval's logged samples."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    results = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={checkpoint},dtype=float32",
                                      tasks=list(tasks), num_fewshot=mmlu.SHOTS, batch_size=batch_size,
                                      log_samples=True, task_manager=TaskManager(include_path=str(include)),
                                      device="cpu")
    out = {}
    for name, ids in tasks.items():
        for sample in results["samples"][name]:
            out[ids[sample["doc_id"]]] = [(float(r[0]), bool(r[1])) for r in sample["filtered_resps"]]
    return out


def compare(config: Path, engines_dir: Path, data_dir: Path, limit: int, batch_size: int = 8) -> dict:
    cfg = load_config(config)
    with tempfile.TemporaryDirectory(prefix="lm-eval-mmlu-") as tmp:
        tmp = Path(tmp)
        start = time.perf_counter()  # the build's own results stay as they are: this run writes here
        (ours,) = evaluate(cfg, engines_dir=engines_dir, tasks=["mmlu"], limit=limit, data_dir=data_dir,
                           output=tmp / "mmlu.json")
        ours_s = time.perf_counter() - start
        items = ours.results["items"]
        checkpoint = rounded_checkpoint(cfg, tmp / "checkpoint")
        (tmp / "tasks").mkdir()
        tasks = local_tasks(items, data_dir, tmp / "tasks")
        start = time.perf_counter()
        theirs = run_lm_eval(checkpoint, tasks, tmp / "tasks", batch_size)
        theirs_s = time.perf_counter() - start
    rows, worst = [], 0.0
    for item in items:
        lls = [ll for ll, _ in theirs[item["id"]]]
        prediction = LETTERS[max(range(len(LETTERS)), key=lambda i: lls[i])]  # first of ties, as numpy's argmax
        delta = max(abs(a - b) for a, b in zip(item["logprobs"], lls))
        worst = max(worst, delta)
        rows.append({"id": item["id"], "target": item["target"], "prediction": item["prediction"],
                     "lm_eval_prediction": prediction, "logprobs": item["logprobs"], "lm_eval_logprobs": lls,
                     "max_abs_delta": delta})
    same = sum(r["prediction"] == r["lm_eval_prediction"] for r in rows)
    return {
        "config": cfg.name, "model": cfg.model.source, "dtype": f"{cfg.dtype} weights, float32 compute (both)",
        "items": len(rows), "shots": mmlu.SHOTS, "limit": limit, "data_dir": str(data_dir),
        "predictions_identical": same, "max_abs_delta_loglikelihood": worst,
        "accuracy": {"trtllm_pipeline": sum(r["prediction"] == r["target"] for r in rows) / len(rows),
                     "lm_eval": sum(r["lm_eval_prediction"] == r["target"] for r in rows) / len(rows)},
        "seconds": {"trtllm_pipeline": round(ours_s, 1), "lm_eval": round(theirs_s, 1)},
        "runtime": ours.results["runtime_info"].get("device"),
        "versions": artifacts.package_versions("lm_eval", "torch", "transformers"),
        "command": "python " + " ".join(sys.argv) if sys.argv and sys.argv[0].endswith("lm_eval_mmlu.py") else None,
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", type=Path, required=True)
    parser.add_argument("--engines-dir", type=Path, default=Path("engines"))
    parser.add_argument("--data-dir", type=Path, required=True, help="mmlu/{dev,test}/*.csv (the MMLU release)")
    parser.add_argument("--limit", type=int, default=57, help="questions (stratified as eval --limit); 57: one a subject")
    parser.add_argument("--batch-size", type=int, default=8, help="lm-eval's")
    parser.add_argument("-o", "--output", type=Path, default=None)
    args = parser.parse_args()
    result = compare(args.config, args.engines_dir, args.data_dir, args.limit, args.batch_size)
    for row in result["rows"]:
        print(f"{row['id']:45s} {row['prediction']} {row['lm_eval_prediction']}  max|ΔLL| {row['max_abs_delta']:.2e}")
    print(f"\n{result['items']} items: predictions identical on {result['predictions_identical']}, "
          f"max |ΔLL| {result['max_abs_delta_loglikelihood']:.2e}; accuracy {result['accuracy']}; "
          f"seconds {result['seconds']}")
    if args.output:
        artifacts.write_json_atomic(args.output, result)


if __name__ == "__main__":
    main()
