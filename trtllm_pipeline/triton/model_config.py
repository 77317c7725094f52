"""Triton ``config.pbtxt`` files built as ``ModelConfig`` protos, never as text templates.

Building the message with protobuf (the ``model_config.proto`` that tritonclient ships) means a
config cannot hold an unfilled ``${...}`` placeholder or a misspelt field: TensorRT-LLM's own
templates fail at server start on exactly that (triton-inference-server/server#8592).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

CONFIG_FILE = "config.pbtxt"


def tensor(name: str, data_type: str, dims: list[int], *, optional: bool = False, scalar: bool = False,
           ragged: bool = False) -> dict[str, Any]:
    """One input or output. ``scalar``: a ``[1]`` tensor the model sees as one value per batch row
    (``reshape: { shape: [ ] }``), as the TensorRT-LLM backend declares its per-request settings."""
    spec: dict[str, Any] = {"name": name, "data_type": data_type, "dims": dims}
    if scalar:
        spec["reshape"] = {"shape": []}
    if optional:
        spec["optional"] = True
    if ragged:
        spec["allow_ragged_batch"] = True
    return spec


def parameters(values: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Model parameters are strings in Triton; booleans as TensorRT-LLM reads them (true/false)."""
    return {key: {"string_value": str(v).lower() if isinstance(v, bool) else str(v)} for key, v in values.items()}


def build(spec: dict[str, Any]) -> model_config_pb2.ModelConfig:
    return json_format.ParseDict(spec, model_config_pb2.ModelConfig())


def write(model_dir: Path, config: model_config_pb2.ModelConfig) -> Path:
    model_dir.mkdir(parents=True, exist_ok=True)
    path = model_dir / CONFIG_FILE
    path.write_text(text_format.MessageToString(config), encoding="utf-8")
    return path


def read(path: Path) -> model_config_pb2.ModelConfig:
    """Parse a ``config.pbtxt`` as Triton does (raises ``text_format.ParseError`` when invalid)."""
    return text_format.Parse(Path(path).read_text(encoding="utf-8"), model_config_pb2.ModelConfig())
