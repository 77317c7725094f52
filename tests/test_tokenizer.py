"""``trtllm_pipeline.tokenizer`` against ``transformers.AutoTokenizer``, and no transformers in Triton's stub.

Two tokenizer directories as a build keeps them (``tokenizer.json`` + ``tokenizer_config.json``): the
built-in tiny Qwen2's (R1-distill's special tokens and chat template, BOS from its post-processor)
and a Qwen2-style one made here with the `tokenizers` library (Qwen2's normalizer, pre-tokenizer and
ChatML added tokens, ``tokenizer_class: Qwen2Tokenizer``, no BOS), plus the tiny one with a config
that asks for no BOS and an EOS (flags the post-processor of tokenizer.json overrides, in both). Real
MMLU and GSM8K texts, chat-templated conversations and odd text: ids, decoded text and special tokens
must be transformers' exactly.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from trtllm_pipeline.model.builtin import builtin_model_dir
from trtllm_pipeline.tokenizer import Tokenizer

QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
              r"\s*[\r\n]+|\s+(?!\S)|\s+")
CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
          "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
ODD = ["", " ", "   \n\n\t  x  \r\n", "a  b   c    d", "Grüße aus München", "日本語のテキスト。", "e\u0301 vs \u00e9",
       "emoji 👍🏽 👨‍👩‍👧 ok", "\ufffd lone", "\x00\x01 control \x7f", "x'S 'll 'RE n't", "<|endoftext|>",
       "<|im_start|>user\nhi<|im_end|>", "<｜begin▁of▁sentence｜>x<｜end▁of▁sentence｜>", "tab\tand\u00a0nbsp\u2028"]
CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Grüße 👍 what is 2+2?"},
     {"role": "assistant", "content": "<think>hm</think>4"}, {"role": "user", "content": "and 3+3?"}],
]


@pytest.fixture(scope="module")
def texts(data_dir) -> list[str]:
    """A few hundred real texts: GSM8K questions with their worked answers, MMLU questions with their choices."""
    rows = [json.loads(line) for line in (data_dir / "gsm8k" / "test.jsonl").read_text().splitlines()[:150]]
    out = [f"{r['question']}\n{r['answer']}" for r in rows]
    for path in sorted((data_dir / "mmlu" / "test").glob("*.csv"))[::3]:
        with open(path, encoding="utf-8", newline="") as f:
            out += ["\n".join(row[:5]) for row in list(csv.reader(f))[:8]]
    return out + ODD


def tiny(out: Path, **config) -> Path:
    """The tiny Qwen2's tokenizer files as quantize copies them into a build (no config.json beside them)."""
    source = builtin_model_dir("tiny-qwen2")
    out.mkdir(parents=True)
    shutil.copyfile(source / "tokenizer.json", out / "tokenizer.json")
    settings = {**json.loads((source / "tokenizer_config.json").read_text()), **config}
    (out / "tokenizer_config.json").write_text(json.dumps(settings, ensure_ascii=False))
    return out


def qwen2_style(out: Path, data_dir: Path) -> Path:
    """A small byte-level BPE with Qwen2's pipeline, trained on GSM8K's training questions, and Qwen2's config."""
    from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from tokenizers import Tokenizer as Backend

    backend = Backend(models.BPE())
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN_SPLIT), "isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    train = [json.loads(line)["question"] for line in (data_dir / "gsm8k" / "train.jsonl").read_text().splitlines()]
    backend.train_from_iterator(train[:2000], trainers.BpeTrainer(
        vocab_size=3000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in specials])
    out.mkdir(parents=True)
    backend.save(str(out / "tokenizer.json"))
    added = {str(backend.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                           "single_word": False, "special": True} for t in specials}
    (out / "tokenizer_config.json").write_text(json.dumps({
        "add_prefix_space": False, "added_tokens_decoder": added, "additional_special_tokens": specials[1:],
        "bos_token": None, "chat_template": CHATML, "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
        "errors": "replace", "model_max_length": 32768, "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}))
    return out


@pytest.fixture(scope="module")
def directories(tmp_path_factory, data_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    return {"tiny": tiny(root / "tiny"), "tiny-eos-no-bos": tiny(root / "eos", add_bos_token=False, add_eos_token=True),
            "qwen2-style": qwen2_style(root / "qwen2", data_dir)}


@pytest.mark.parametrize("name", ["tiny", "tiny-eos-no-bos", "qwen2-style"])
def test_ids_and_text_are_transformers_own(name, directories, texts):
    from transformers import AutoTokenizer

    ours, theirs = Tokenizer(directories[name]), AutoTokenizer.from_pretrained(directories[name])
    for attr in ("bos_token", "eos_token", "pad_token", "bos_token_id", "eos_token_id", "pad_token_id",
                 "all_special_tokens", "all_special_ids", "vocab_size"):
        assert getattr(ours, attr) == getattr(theirs, attr), attr
    assert len(ours) == len(theirs)
    for text in texts:
        for special in (True, False):
            ids = theirs.encode(text, add_special_tokens=special)
            assert ours.encode(text, add_special_tokens=special) == ids, (text, special)
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
        assert ours.convert_ids_to_tokens(ids) == theirs.convert_ids_to_tokens(ids)
        # Every prefix of the ids, as a stream decodes them: lone bytes of a character included.
        for n in range(min(len(ids), 12)):
            assert ours.decode(ids[:n], skip_special_tokens=True) == theirs.decode(ids[:n], skip_special_tokens=True)
    batch = texts[:20]
    assert ours(batch, add_special_tokens=True)["input_ids"] == theirs(batch, add_special_tokens=True)["input_ids"]


@pytest.mark.parametrize("name", ["tiny", "qwen2-style"])
def test_the_chat_template_renders_and_tokenizes_as_transformers_does(name, directories):
    from transformers import AutoTokenizer

    ours, theirs = Tokenizer(directories[name]), AutoTokenizer.from_pretrained(directories[name])
    for messages in CONVERSATIONS:
        for generation_prompt in (True, False):
            text = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
            assert ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt) == text
            assert ours.encode(text, add_special_tokens=False) == theirs.encode(text, add_special_tokens=False)


def test_a_directory_without_tokenizer_json_is_an_input_error(tmp_path):
    from trtllm_pipeline.errors import InputError

    with pytest.raises(InputError, match="no tokenizer.json"):
        Tokenizer(tmp_path)


REFUSE_TRANSFORMERS = """
import importlib.abc, sys, types
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "transformers" or name.startswith("transformers."):
            raise ImportError("transformers is refused: code that runs in Triton's stub must not import it")
sys.meta_path.insert(0, Refuse())
"""

STUB_SIDE = """
import json, runpy, sys, types
from pathlib import Path
engines, repo = Path(sys.argv[1]), Path(sys.argv[2])
utils = types.ModuleType("triton_python_backend_utils")  # Triton's module, as far as the imports need it
utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
sys.modules["triton_python_backend_utils"] = utils
for model in sorted((repo / "trtllm_pipeline" / "triton" / "python_models").glob("*/model.py")):
    runpy.run_path(str(model))  # every import of every Python model
from trtllm_pipeline.config import load_config
from trtllm_pipeline.runtimes.base import SamplingParams
from trtllm_pipeline.runtimes.registry import load_runtime
from trtllm_pipeline.triton.contract import RequestLimits
from trtllm_pipeline.triton.tensors import Preprocessor, decode_rows
import numpy as np
runtime = load_runtime(load_config(repo / "build_configs" / "tiny-qwen2-fp8-tp1.yaml"), engines)
ids = runtime.tokenizer.encode("The capital of France is", add_special_tokens=True)
out = runtime.generate([ids], SamplingParams(max_tokens=6))[0]
pre = Preprocessor(runtime.tokenizer, end_id=runtime.tokenizer.eos_token_id, pad_id=runtime.tokenizer.eos_token_id,
                   limits=RequestLimits(max_input_tokens=64, max_seq_len=128, max_text_bytes=4096, max_batch=1))
tensors = pre(np.array([[b"The capital of France is"]], dtype=object), np.array([[6]], dtype=np.int32))
text = decode_rows(runtime.tokenizer, np.array([[out.token_ids]]), np.array([[len(out.token_ids)]]))
runtime.close()
print(json.dumps({"transformers": "transformers" in sys.modules, "ids": tensors["INPUT_ID"][0].tolist() == ids,
                  "tokens": len(out.token_ids), "text": text[0][0].decode() == out.text}))
"""


def test_the_stub_side_imports_no_transformers(built, engines_dir):
    built("tiny-qwen2-fp8-tp1")
    proc = subprocess.run([sys.executable, "-c", REFUSE_TRANSFORMERS + STUB_SIDE, str(engines_dir), str(REPO)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == {"transformers": False, "ids": True, "tokens": 6, "text": True}
