"""A build's tokenizer on the ``tokenizers`` library alone: ``tokenizer.json`` plus ``tokenizer_config.json``.

What runs inside Triton's Python stub must not import transformers (with the stub's numpy<2, an
image's scipy built for numpy 2 fails, and transformers with it: docs/serving.md), and it need not:
a fast tokenizer is ``tokenizer.json`` read by ``tokenizers``, and transformers adds only what
``tokenizer_config.json`` says. This module does the same for the subset of ``AutoTokenizer`` the
package uses, with transformers' (5.x) rules:

* special tokens: ``bos_token``/``eos_token``/``pad_token``/``unk_token`` (strings or AddedToken
  dicts), ``additional_special_tokens``/``extra_special_tokens`` and ``added_tokens_decoder`` are added
  to the backend where ``tokenizer.json`` lacks them (named ones marked special);
* BOS/EOS: the post-processor of ``tokenizer.json`` adds them (``add_special_tokens``), as in
  transformers' generic fast tokenizer, which does not apply a config's ``add_bos_token`` or
  ``add_eos_token`` either (4.x ``PreTrainedTokenizerFast`` and 5.x ``TokenizersBackend``; classes of
  their own such as Llama's rebuild the pipeline, which a build's tokenizer directory does not ask for);
* decoding: the backend's decoder, ``skip_special_tokens`` as given; ``clean_up_tokenization_spaces``
  applied except for BPE models (transformers 5 ignores it there: it would corrupt their text);
* the chat template through jinja2, rendered as transformers renders it (``chat_template.jinja`` or
  the config's ``chat_template``).

``tests/test_tokenizer.py`` holds it to ``transformers.AutoTokenizer`` on real texts.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Sequence

from trtllm_pipeline.errors import InputError

SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class Tokenizer:
    def __init__(self, directory: str | Path):
        from tokenizers import AddedToken
        from tokenizers import Tokenizer as Backend

        directory = Path(directory)
        if not (directory / "tokenizer.json").is_file():
            raise InputError(f"{directory} has no tokenizer.json, which serving loads (with the tokenizers library).",
                             fix="quantize again (it writes tokenizer.json from a slow tokenizer), or save the "
                                 "tokenizer there with transformers' save_pretrained")
        self.backend = Backend.from_file(str(directory / "tokenizer.json"))
        config_path = directory / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        map_path = directory / "special_tokens_map.json"  # older tokenizers name their special tokens here
        if map_path.is_file():
            config = {**config, **json.loads(map_path.read_text(encoding="utf-8"))}
        self.config = config
        self.special = {name: _content(config.get(name)) for name in SPECIAL_NAMES if _content(config.get(name))}
        extra = config.get("additional_special_tokens") or config.get("extra_special_tokens") or []
        self.extra_special = [_content(t) for t in (extra.values() if isinstance(extra, dict) else extra)]
        present = {t.content for t in self.backend.get_added_tokens_decoder().values()}
        missing = [_added_token(AddedToken, spec) for _, spec in
                   sorted(((int(i), spec) for i, spec in (config.get("added_tokens_decoder") or {}).items()))
                   if spec.get("content") not in present]
        named = [*self.special.values(), *self.extra_special]
        missing += [AddedToken(t, special=True) for t in named
                    if t not in present and t not in {m.content for m in missing}]
        if missing:
            self.backend.add_tokens(missing)
        self.clean_up_tokenization_spaces = bool(config.get("clean_up_tokenization_spaces", False)) and (
            type(self.backend.model).__name__ != "BPE"
            or bool(config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output")))
        template_file = directory / "chat_template.jinja"
        self.chat_template = (template_file.read_text(encoding="utf-8") if template_file.is_file()
                              else config.get("chat_template"))

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> "Tokenizer":
        return cls(directory)

    # ----------------------------------------------------------------- ids and text

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def __call__(self, text: str | Sequence[str], add_special_tokens: bool = True) -> dict[str, Any]:
        """``{"input_ids": ids}`` for a text, a list of them for a list (no padding, no truncation)."""
        if isinstance(text, str):
            return {"input_ids": self.encode(text, add_special_tokens=add_special_tokens)}
        batch = self.backend.encode_batch(list(text), add_special_tokens=add_special_tokens)
        return {"input_ids": [encoding.ids for encoding in batch]}

    def decode(self, ids: int | Sequence[int], skip_special_tokens: bool = False) -> str:
        ids = [ids] if isinstance(ids, int) else [int(i) for i in ids]
        text = self.backend.decode(ids, skip_special_tokens=skip_special_tokens)
        return _clean_up(text) if self.clean_up_tokenization_spaces else text

    def convert_ids_to_tokens(self, ids: int | Sequence[int], skip_special_tokens: bool = False):
        if isinstance(ids, int):
            return self.backend.id_to_token(ids)
        skip = set(self.all_special_ids) if skip_special_tokens else set()
        return [self.backend.id_to_token(int(i)) for i in ids if int(i) not in skip]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]):
        if isinstance(tokens, str):
            return self.backend.token_to_id(tokens)
        return [self.backend.token_to_id(t) for t in tokens]

    def convert_tokens_to_string(self, tokens: Sequence[str]) -> str:
        return self.backend.decoder.decode(list(tokens)) if self.backend.decoder else " ".join(tokens)

    def __len__(self) -> int:  # the vocabulary with the added tokens, as transformers counts it
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def vocab_size(self) -> int:  # without the added tokens, as transformers' vocab_size
        return self.backend.get_vocab_size(with_added_tokens=False)

    # ----------------------------------------------------------------- special tokens

    def _special(self, name: str) -> str | None:
        return self.special.get(name)

    def _special_id(self, name: str) -> int | None:
        token = self.special.get(name)
        return None if token is None else self.backend.token_to_id(token)

    bos_token = property(functools.partial(_special, name="bos_token"))
    eos_token = property(functools.partial(_special, name="eos_token"))
    pad_token = property(functools.partial(_special, name="pad_token"))
    unk_token = property(functools.partial(_special, name="unk_token"))
    bos_token_id = property(functools.partial(_special_id, name="bos_token"))
    eos_token_id = property(functools.partial(_special_id, name="eos_token"))
    pad_token_id = property(functools.partial(_special_id, name="pad_token"))
    unk_token_id = property(functools.partial(_special_id, name="unk_token"))

    @property
    def all_special_tokens(self) -> list[str]:
        return list(dict.fromkeys([*self.special.values(), *self.extra_special]))

    @property
    def all_special_ids(self) -> list[int]:
        return [self.backend.token_to_id(t) for t in self.all_special_tokens]

    # ----------------------------------------------------------------- chat template

    def apply_chat_template(self, messages: list[dict[str, Any]], *, tokenize: bool = True,
                            add_generation_prompt: bool = False, **kwargs: Any):
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        text = _compiled(self.chat_template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                                    **self.special, **kwargs)
        return self.encode(text, add_special_tokens=False) if tokenize else text


def _content(value: Any) -> str | None:
    """A special token as the config writes it: a string, or an AddedToken's dict."""
    return value.get("content") if isinstance(value, dict) else value


def _added_token(cls, spec: dict[str, Any]):
    return cls(spec["content"], single_word=spec.get("single_word", False), lstrip=spec.get("lstrip", False),
               rstrip=spec.get("rstrip", False), normalized=spec.get("normalized", True),
               special=spec.get("special", False))


def _clean_up(text: str) -> str:
    for spaced, joined in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                           (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(spaced, joined)
    return text


@functools.lru_cache(maxsize=8)
def _compiled(template: str):
    """The template in jinja2's sandbox, with the filters and globals transformers gives chat templates."""
    from datetime import datetime

    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        from jinja2.exceptions import TemplateError

        raise TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)
