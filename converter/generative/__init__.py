"""Converting decoder-only language models: a Hugging Face model directory (or an ONNX Runtime GenAI export) in,
one signed generative bundle per hardware profile out (formats onnx-genai and openvino-genai).

The public API: `convert_generative(ConvertRequest, progress)` → a `ProfileResult` per profile;
`is_generative(path)` (whether a path takes this route) and `load_decoder(path)` → `DecoderSource` (what the model
is, or a UserInputError saying what to give instead); `inspect_decoder` (`edgefleet inspect`); `QualityBars` and
the default bars. Names are imported on first use, so importing this room costs nothing until a language model is
converted.

Modules, one idea each: source (recognize, describe), text (tokenized slices), bars (the defaults and why),
candidates (declared per target), builders/ (the anchors' builders and post-passes), runtimes/ (ONNX Runtime GenAI,
OpenVINO GenAI, the FP32 reference), judge, timing, limit, golden, choose, record (one candidate's figures),
bundle, conversion, inspection; quiet (builders' output) and torch_setup (passive OpenMP, no hub).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgefleet.converter.generative.bars import (
        DEFAULT_MAX_PERPLEXITY_RATIO,
        DEFAULT_MIN_NEXT_TOKEN_AGREEMENT,
        DEFAULT_OUTPUT_TOKENS,
        DEFAULT_PROMPT_TOKENS,
        QualityBars,
    )
    from edgefleet.converter.generative.conversion import convert_generative
    from edgefleet.converter.generative.inspection import inspect_decoder
    from edgefleet.converter.generative.source import DecoderSource, is_generative, load_decoder

_WHERE = {
    "convert_generative": "conversion",
    "inspect_decoder": "inspection",
    "DecoderSource": "source",
    "is_generative": "source",
    "load_decoder": "source",
    "QualityBars": "bars",
    "DEFAULT_MAX_PERPLEXITY_RATIO": "bars",
    "DEFAULT_MIN_NEXT_TOKEN_AGREEMENT": "bars",
    "DEFAULT_PROMPT_TOKENS": "bars",
    "DEFAULT_OUTPUT_TOKENS": "bars",
}
__all__ = [
    "DEFAULT_MAX_PERPLEXITY_RATIO",
    "DEFAULT_MIN_NEXT_TOKEN_AGREEMENT",
    "DEFAULT_OUTPUT_TOKENS",
    "DEFAULT_PROMPT_TOKENS",
    "DecoderSource",
    "QualityBars",
    "convert_generative",
    "inspect_decoder",
    "is_generative",
    "load_decoder",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}; its API: {', '.join(__all__)}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
