"""A model zoo nobody here wrote: KernelBench-format tasks built from torchvision, HF transformers and
torch.nn with random init (no weights are downloaded), and the offline compiler run over them.

    python benchmarks/zoo.py write DIR [--sample]          # the task files
    python benchmarks/zoo.py run [--sample] [--only a,b]   # compile each on the CPU, print the table
    python benchmarks/zoo.py coverage                      # core-ATen forward operators without a lowering

``run`` writes every program (CPU only, no GPU), then prints a table (program written or refused,
seconds), the count of each refusal reason, and the check the compiler owes: no refusal names a
fusion group or a layout, only a missing operator lowering or a capture torch cannot make.

Each task is a model as a user runs it for inference: ``.eval()`` in the constructor where the model
has dropout, stochastic depth or an auxiliary head (its docstring says so), training mode otherwise
(as KernelBench leaves a model); a tensor out (logits, ``last_hidden_state``) or the nested tuple a
recurrent layer returns; inputs as the model takes them (int64 ``input_ids`` and an attention mask with padded rows where it takes one). Held
out: timm and KernelBench level 3 are not used here.

torchvision's wheel on the package index is a CUDA build; beside a CPU torch its C operators do not
load and ``import torchvision`` fails registering fake kernels for ``torchvision::nms``/``qnms``.
Every task (and transformers, which imports torchvision when present) goes through
``_import_torchvision`` below, which defines those two schemas first in that case.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

IMPORT_TORCHVISION = '''
def _import_torchvision():
    """torchvision, also where its wheel is a CUDA build beside a CPU build of torch: there its C
    operators cannot load and its import fails registering fake kernels for torchvision::nms and
    qnms, so those two schemas are defined first (this model uses neither)."""
    global _TORCHVISION_SCHEMAS
    if not hasattr(torch.ops.torchvision, "nms"):
        package = Path(torch.__file__).parent.parent / "torchvision"  # pip puts both in one site-packages
        try:
            torch.ops.load_library(str(next(package.glob("_C*.so"))))
        except (OSError, StopIteration):  # its C operators do not load here
            _TORCHVISION_SCHEMAS = torch.library.Library("torchvision", "DEF")
            _TORCHVISION_SCHEMAS.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            _TORCHVISION_SCHEMAS.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    import torchvision
    return torchvision
'''


@dataclass
class ZooModel:
    name: str
    library: str  # torchvision, transformers, torch.nn, own
    kind: str  # cnn, transformer, recurrent
    build: str  # statements in __init__ that set self.net
    forward: str  # the body of forward(self, <args>)
    args: str  # forward's parameters
    inputs: str  # get_inputs' return expression
    about: str = ""
    helpers: str = ""  # module-level code the model needs (own architectures)
    eval_mode: bool | None = None  # None: decided from the built model (dropout, stochastic depth, aux heads)
    reasons: list[str] = field(default_factory=list)


def _torchvision(name: str, size: int = 224, batch: int = 4, extra: str = "") -> ZooModel:
    return ZooModel(
        name=f"tv_{name}", library="torchvision", kind="transformer" if name.startswith(("vit", "swin", "maxvit"))
        else "cnn", build=f"self.net = _import_torchvision().models.{name}(weights=None{extra})",
        forward="return self.net(x)", args="x", inputs=f"[torch.randn({batch}, 3, {size}, {size})]",
        about=f"torchvision {name}, random init, a batch of {batch} {size}x{size} images: its logits.")


TORCHVISION = ["alexnet", "convnext_tiny", "convnext_small", "convnext_base", "convnext_large", "densenet121",
               "densenet161", "densenet169", "densenet201", "efficientnet_b0", "efficientnet_b1", "efficientnet_b2",
               "efficientnet_b3", "efficientnet_b4", "efficientnet_b5", "efficientnet_b6", "efficientnet_b7",
               "efficientnet_v2_s", "efficientnet_v2_m", "efficientnet_v2_l", "googlenet", "inception_v3",
               "maxvit_t", "mnasnet0_5", "mnasnet0_75", "mnasnet1_0", "mnasnet1_3", "mobilenet_v2",
               "mobilenet_v3_large", "mobilenet_v3_small", "regnet_x_400mf", "regnet_x_800mf", "regnet_x_1_6gf",
               "regnet_x_3_2gf", "regnet_x_8gf", "regnet_x_16gf", "regnet_x_32gf", "regnet_y_400mf",
               "regnet_y_800mf", "regnet_y_1_6gf", "regnet_y_3_2gf", "regnet_y_8gf", "regnet_y_16gf",
               "regnet_y_32gf", "regnet_y_128gf", "resnet18", "resnet34", "resnet50", "resnet101", "resnet152",
               "resnext50_32x4d", "resnext101_32x8d", "resnext101_64x4d", "shufflenet_v2_x0_5",
               "shufflenet_v2_x1_0", "shufflenet_v2_x1_5", "shufflenet_v2_x2_0", "squeezenet1_0", "squeezenet1_1",
               "swin_t", "swin_s", "swin_b", "swin_v2_t", "swin_v2_s", "swin_v2_b", "vgg11", "vgg11_bn", "vgg13",
               "vgg13_bn", "vgg16", "vgg16_bn", "vgg19", "vgg19_bn", "vit_b_16", "vit_b_32", "vit_l_16",
               "vit_l_32", "vit_h_14", "wide_resnet50_2", "wide_resnet101_2"]
_HUGE = {"regnet_y_128gf", "vit_h_14", "vit_l_16", "efficientnet_b7", "efficientnet_v2_l"}  # batch 2


def _tokens(batch: int, seq: int, vocab: int, mask: bool) -> str:
    ids = f"torch.randint(0, {vocab}, ({batch}, {seq}), dtype=torch.int64)"
    if not mask:
        return f"[{ids}]"
    # padded rows: the second half of the batch ends in 32 padding positions
    return f"[{ids}, _padding_mask({batch}, {seq})]"


PADDING_MASK = '''
def _padding_mask(batch, seq):
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[batch // 2:, seq - 32:] = 0
    return mask
'''


def _hf(name: str, config: str, model: str, *, inputs: str, args: str, call: str, about: str,
        out: str = "last_hidden_state", module: str = "") -> ZooModel:
    where = f"from transformers.models.{module} import modeling_{module} as m; " if module else ""
    build = (f"_import_torchvision()  # transformers imports it when installed\n"
             f"import transformers\n"
             f"{where}config = transformers.{config}\n"
             f"config.use_cache = False\n"
             f"self.net = {model}")
    return ZooModel(name=f"hf_{name}", library="transformers", kind="transformer", build=build,
                    forward=f"return self.net({call}).{out}", args=args, inputs=inputs,
                    about=f"HF transformers {about}, random init from a small config: its {out}.")


def _decoder(name: str, config: str, model: str, about: str, batch: int = 4, seq: int = 256) -> ZooModel:
    return _hf(name, config, f"transformers.{model}(config)", inputs=_tokens(batch, seq, 5000, True),
               args="input_ids, attention_mask", call="input_ids=input_ids, attention_mask=attention_mask",
               about=about)


_SMALL = "vocab_size=5000, max_position_embeddings=512"
TRANSFORMERS = [
    _decoder("gpt2", "GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=5000, n_positions=512)", "GPT2Model",
             "GPT-2 (2 layers, 256 wide)"),
    _decoder("gpt2_square", "GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=5000, n_positions=512)",
             "GPT2Model", "GPT-2 (2 layers, 128 wide) on 128 tokens: sequence length = width", batch=2, seq=128),
    _decoder("llama", f"LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=2, "
             f"num_attention_heads=4, num_key_value_heads=2, {_SMALL})", "LlamaModel",
             "Llama (2 layers, 256 wide, grouped-query attention)"),
    _decoder("mistral", f"MistralConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=2, "
             f"num_attention_heads=4, num_key_value_heads=2, {_SMALL})", "MistralModel",
             "Mistral (2 layers, 256 wide, grouped-query attention)"),
    _decoder("qwen2", f"Qwen2Config(hidden_size=256, intermediate_size=688, num_hidden_layers=2, "
             f"num_attention_heads=4, num_key_value_heads=2, {_SMALL})", "Qwen2Model",
             "Qwen2 (2 layers, 256 wide, grouped-query attention)"),
    _decoder("gemma", f"GemmaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=2, "
             f"num_attention_heads=4, num_key_value_heads=1, head_dim=64, {_SMALL})", "GemmaModel",
             "Gemma (2 layers, 256 wide, multi-query attention)"),
    _decoder("phi", f"PhiConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=2, "
             f"num_attention_heads=4, {_SMALL})", "PhiModel", "Phi (2 layers, 256 wide)"),
    _decoder("falcon", "FalconConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, vocab_size=5000)",
             "FalconModel", "Falcon (2 layers, 256 wide)"),
    _decoder("gpt_neox", f"GPTNeoXConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=2, "
             f"num_attention_heads=4, {_SMALL})", "GPTNeoXModel", "GPT-NeoX (2 layers, 256 wide)"),
    _decoder("opt", "OPTConfig(hidden_size=256, ffn_dim=1024, num_hidden_layers=2, num_attention_heads=4, "
             "word_embed_proj_dim=256, vocab_size=5000, max_position_embeddings=512)", "OPTModel",
             "OPT (2 layers, 256 wide)"),
    _decoder("bert", f"BertConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=2, "
             f"num_attention_heads=4, {_SMALL})", "BertModel", "BERT (2 layers, 256 wide)"),
    _decoder("roberta", "RobertaConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=2, "
             "num_attention_heads=4, vocab_size=5000, max_position_embeddings=520)", "RobertaModel",
             "RoBERTa (2 layers, 256 wide)"),
    _decoder("albert", f"AlbertConfig(embedding_size=128, hidden_size=256, intermediate_size=1024, "
             f"num_hidden_layers=2, num_attention_heads=4, {_SMALL})", "AlbertModel",
             "ALBERT (2 layers, 256 wide, 128-wide embeddings)"),
    _decoder("distilbert", "DistilBertConfig(dim=256, hidden_dim=1024, n_layers=2, n_heads=4, vocab_size=5000, "
             "max_position_embeddings=512)", "DistilBertModel", "DistilBERT (2 layers, 256 wide)"),
    _hf("bart_encoder", "BartConfig(d_model=256, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, "
        "decoder_attention_heads=4, encoder_ffn_dim=1024, decoder_ffn_dim=1024, vocab_size=5000, "
        "max_position_embeddings=512)", "m.BartEncoder(config)", module="bart",
        inputs=_tokens(4, 256, 5000, True), args="input_ids, attention_mask",
        call="input_ids=input_ids, attention_mask=attention_mask", about="BART's encoder (2 layers, 256 wide)"),
    _hf("t5_encoder", "T5Config(d_model=256, d_kv=64, d_ff=1024, num_layers=2, num_heads=4, vocab_size=5000)",
        "transformers.T5EncoderModel(config)", inputs=_tokens(4, 256, 5000, True), args="input_ids, attention_mask",
        call="input_ids=input_ids, attention_mask=attention_mask", about="T5's encoder (2 layers, 256 wide)"),
    _hf("vit", "ViTConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4, "
        "image_size=224, patch_size=16)", "transformers.ViTModel(config)", inputs="[torch.randn(4, 3, 224, 224)]",
        args="pixel_values", call="pixel_values=pixel_values", about="ViT (2 layers, 256 wide, 16x16 patches)"),
    _hf("swin", "SwinConfig(image_size=224, embed_dim=64, depths=[2, 2], num_heads=[2, 4])",
        "transformers.SwinModel(config)", inputs="[torch.randn(4, 3, 224, 224)]", args="pixel_values",
        call="pixel_values=pixel_values", about="Swin (two stages of 2 blocks, 64/128 wide)"),
    _hf("convnext", "ConvNextConfig(hidden_sizes=[64, 128, 256, 512], depths=[1, 1, 2, 1])",
        "transformers.ConvNextModel(config)", inputs="[torch.randn(4, 3, 224, 224)]", args="pixel_values",
        call="pixel_values=pixel_values", about="ConvNeXt (4 stages, 64-512 wide)"),
    _hf("clip_vision", "CLIPVisionConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=2, "
        "num_attention_heads=4, image_size=224, patch_size=16)", "transformers.CLIPVisionModel(config)",
        inputs="[torch.randn(4, 3, 224, 224)]", args="pixel_values", call="pixel_values=pixel_values",
        about="CLIP's vision tower (2 layers, 256 wide)"),
    _hf("whisper_encoder", "WhisperConfig(d_model=256, encoder_layers=2, decoder_layers=2, "
        "encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=1024, decoder_ffn_dim=1024, "
        "num_mel_bins=80, max_source_positions=256, vocab_size=5000)", "m.WhisperEncoder(config)",
        module="whisper", inputs="[torch.randn(2, 80, 512)]", args="input_features",
        call="input_features=input_features", about="Whisper's encoder (2 layers, 256 wide, 512 mel frames)"),
]


def _nn(name: str, kind: str, build: str, forward: str, args: str, inputs: str, about: str) -> ZooModel:
    return ZooModel(name=f"nn_{name}", library="torch.nn", kind=kind, build=build, forward=forward, args=args,
                    inputs=inputs, about=about)


TORCH_NN = [
    _nn("lstm", "recurrent", "self.net = nn.LSTM(128, 256, num_layers=2, batch_first=True)",
        "return self.net(x)[0]", "x", "[torch.randn(4, 256, 128)]",
        "nn.LSTM, 2 layers, batch-first, no initial state: the output sequence."),
    _nn("lstm_bidirectional_state", "recurrent", "self.net = nn.LSTM(128, 256, num_layers=2, bidirectional=True)",
        "output, (h_n, c_n) = self.net(x, (h0, c0))\n        return c_n", "x, h0, c0",
        "[torch.randn(128, 4, 128), torch.randn(4, 4, 256), torch.randn(4, 4, 256)]",
        "nn.LSTM, 2 layers, bidirectional, sequence-first, given initial states: the last cell state c_n."),
    _nn("gru", "recurrent", "self.net = nn.GRU(128, 256, num_layers=2, bidirectional=True)",
        "return self.net(x)[1]", "x", "[torch.randn(128, 4, 128)]",
        "nn.GRU, 2 layers, bidirectional, sequence-first: the last hidden state h_n."),
    _nn("rnn", "recurrent", "self.net = nn.RNN(128, 256, num_layers=3, batch_first=True)",
        "return self.net(x, h0)[0]", "x, h0", "[torch.randn(4, 128, 128), torch.randn(3, 4, 256)]",
        "nn.RNN (tanh), 3 layers, batch-first, a given initial state: the output sequence."),
    _nn("lstm_states", "recurrent", "self.net = nn.LSTM(128, 256, num_layers=2, batch_first=True)",
        "return self.net(x)", "x", "[torch.randn(4, 128, 128)]",
        "nn.LSTM, 2 layers, batch-first, as users call it: output, (h_n, c_n), a nested tuple."),
    _nn("gru_states", "recurrent", "self.net = nn.GRU(128, 256, num_layers=2, bidirectional=True)",
        "return self.net(x, h0)", "x, h0", "[torch.randn(128, 4, 128), torch.randn(4, 4, 256)]",
        "nn.GRU, 2 layers, bidirectional, a given initial state: output and h_n, a tuple."),
    _nn("transformer_encoder", "transformer",
        "layer = nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True)\n"
        "self.net = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)",
        "return self.net(x)", "x", "[torch.randn(4, 256, 256)]",
        "nn.TransformerEncoder, 2 post-norm layers, 256 wide, 4 heads, batch-first."),
    _nn("transformer_decoder", "transformer",
        "layer = nn.TransformerDecoderLayer(256, 4, 1024, batch_first=True, norm_first=True)\n"
        "self.net = nn.TransformerDecoder(layer, 2)",
        "mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])\n"
        "        return self.net(tgt, memory, tgt_mask=mask, tgt_is_causal=True)", "tgt, memory",
        "[torch.randn(4, 128, 256), torch.randn(4, 256, 256)]",
        "nn.TransformerDecoder, 2 pre-norm layers, 256 wide, a causal mask made in forward."),
    _nn("multihead_attention", "transformer", "self.net = nn.MultiheadAttention(256, 4, batch_first=True)",
        "return self.net(x, x, x, need_weights=False)[0]", "x", "[torch.randn(4, 256, 256)]",
        "nn.MultiheadAttention, self-attention, 256 wide, 4 heads, batch-first."),
]

def _own_models() -> list[ZooModel]:
    """The zoo's own architectures (benchmarks/zoo_own.py): each task file carries its classes' source."""
    import importlib.util
    import inspect

    spec = importlib.util.spec_from_file_location("zoo_own", Path(__file__).with_name("zoo_own.py"))
    own = importlib.util.module_from_spec(spec)
    sys.modules["zoo_own"] = own  # inspect finds a class's file through its module
    spec.loader.exec_module(own)
    models = []
    for name, (classes, build, forward, args, inputs, kind, eval_mode, about) in own.OWN.items():
        helpers = "\n\n" + "\n\n".join(inspect.getsource(getattr(own, c)) for c in classes)
        models.append(ZooModel(name=name, library="own", kind=kind, build=build, forward=forward, args=args,
                               inputs=inputs, about=about, helpers=helpers, eval_mode=eval_mode))
    return models


def catalogue() -> list[ZooModel]:
    models = [_torchvision(n, 299 if n == "inception_v3" else 224, 2 if n in _HUGE else 4) for n in TORCHVISION]
    return models + TRANSFORMERS + TORCH_NN + _own_models()


# About 20 models for CI (at least 8 transformers, 2 recurrent), each a program in seconds on the CPU.
SAMPLE = ["tv_resnet18", "tv_mobilenet_v3_small", "tv_efficientnet_b0", "tv_squeezenet1_1", "tv_shufflenet_v2_x0_5",
          "tv_densenet121", "tv_vit_b_32", "hf_gpt2", "hf_llama", "hf_qwen2", "hf_bert", "hf_distilbert",
          "hf_t5_encoder", "hf_vit", "hf_clip_vision", "hf_whisper_encoder", "nn_lstm", "nn_gru",
          "nn_transformer_encoder", "nn_multihead_attention", "own_unet_softmax", "nn_lstm_states", "own_vit_unfold",
          "own_cosine_attention", "hf_gpt2_square"]


def _needs_eval(model) -> list[str]:
    """Why the model runs in eval mode for inference: its dropout, stochastic depth, auxiliary heads."""
    why = set()
    for m in model.modules():
        kind = type(m).__name__
        p = getattr(m, "p", 0.0)
        if "Dropout" in kind and isinstance(p, float) and p > 0:
            why.add("dropout")
        elif kind == "StochasticDepth" and getattr(m, "p", 0.0) > 0:
            why.add("stochastic depth")
        elif kind in ("InceptionAux",) or (kind == "GoogLeNet" and getattr(m, "aux_logits", False)):
            why.add("auxiliary heads")
        if isinstance(getattr(m, "layerdrop", None), float):
            why.add("layer drop (a random draw per layer in training mode)")
        if "DropPath" in kind and isinstance(getattr(m, "drop_prob", None), float) and m.drop_prob > 0:
            why.add("stochastic depth")
        for attr in ("dropout", "attention_dropout", "attn_dropout", "hidden_dropout", "drop_path_rate"):
            if isinstance(getattr(m, attr, None), float) and getattr(m, attr) > 0:
                why.add("dropout")
    return sorted(why)


def source(model: ZooModel, eval_reasons: list[str]) -> str:
    mode = (f"It runs in eval mode (`.eval()` in the constructor), as a user runs it for inference: it has "
            f"{' and '.join(eval_reasons)}." if eval_reasons else
            "It stays in training mode, as KernelBench leaves a model: it has no dropout, stochastic depth or "
            "auxiliary head.")
    doc = textwrap.fill(f"{model.about} {mode}", 96)
    build = textwrap.indent(model.build + ("\nself.net.eval()" if eval_reasons else ""), " " * 8)
    padding = PADDING_MASK if "_padding_mask" in model.inputs else ""
    return (f'"""{doc}\n\nWritten by benchmarks/zoo.py from {model.library}; random init, nothing downloaded."""\n\n'
            f"from pathlib import Path\n\nimport torch\nimport torch.nn as nn\n\n{IMPORT_TORCHVISION}{model.helpers}{padding}\n\n"
            f"class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n{build.lstrip(chr(10))}\n\n"
            f"    def forward(self, {model.args}):\n        {model.forward}\n\n\n"
            f"def get_inputs():\n    return {model.inputs}\n\n\ndef get_init_inputs():\n    return []\n")


def write(folder: Path, names: list[str] | None = None) -> list[Path]:
    """Write the zoo's task files into ``folder``; the eval-mode decision is made on the built model."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for model in catalogue():
        if names is not None and model.name not in names:
            continue
        text = source(model, [])
        if model.eval_mode is not False:
            scope: dict = {"__name__": f"zoo_{model.name}"}
            exec(compile(text, model.name, "exec"), scope)
            try:
                with torch.device("meta"):
                    built = scope["Model"]()
            except NotImplementedError:  # a constructor that computes on tensors (RegNet's widths)
                built = scope["Model"]()
            reasons = _needs_eval(built)
            text = source(model, reasons)
        path = folder / f"{model.name}.py"
        path.write_text(text)
        written.append(path)
    return written


# -- running the compiler over the zoo -------------------------------------------------------------

# A refusal that names a fusion group or a layout is the compiler refusing its own decision.
LAYOUT_WORDS = re.compile(r"\bgroup\b|strided|contiguous|non-contiguous|outside its group|different shapes|"
                          r"would need a copy|of a computed|does not broadcast|in memory", re.I)


def reason_class(reason: str) -> str:
    """A short class for one refusal reason (the table of the issue that asked for this zoo)."""
    rules = [("scaled_dot_product_attention", "bare scaled_dot_product_attention"),
             ("split_with_sizes|split of|is read outside its group", "a split read outside its group"),
             ("lifted tensor constant", "a lifted tensor constant"),
             ("draws random numbers", "random draws in forward"),
             ("different shapes", "group outputs of different shapes"),
             ("strided|not a tensor in memory|contiguous", "a strided operand"),
             ("would need a copy", "a reshape of a non-contiguous view"),
             ("dtype (int64|int32|bool)|of dtype", "an int64/bool intermediate"),
             ("outputs", "a multi-output operator"),
             ("torch.export could not capture", "capture failure"),
             ("not supported|no lowering", "a missing lowering")]
    for pattern, label in rules:
        if re.search(pattern, reason):
            return label
    return "other"


def _compile_one(path: str) -> dict:
    import os

    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # small configs: its token-id notes are noise
    from stitchcuda.compiler import compile_task
    from stitchcuda.compiler.capture.graph import CaptureError
    from stitchcuda.compiler.emit.codegen import Unsupported
    from stitchcuda.task.load import load_task_file

    start = time.process_time()
    try:
        compiled = compile_task(load_task_file(Path(path)))
        program = compiled.program()
        return {"program": True, "seconds": time.process_time() - start, "reasons": [], "chars": len(program)}
    except (Unsupported, CaptureError) as exc:
        kind = "capture" if isinstance(exc, CaptureError) else "lowering"
        return {"program": False, "seconds": time.process_time() - start, "kind": kind,
                "reasons": [r.strip() for r in str(exc).split("; ") if r.strip()]}
    except Exception as exc:  # a compiler bug: the table shows it rather than dying
        return {"program": False, "seconds": time.process_time() - start, "kind": "crash",
                "reasons": [f"{type(exc).__name__}: {exc}"]}


def _compile_in_child(path: Path, timeout: float) -> dict:
    """One model in a process of its own (``zoo.py one PATH``): a crash or a hang costs only it."""
    try:
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "one", str(path)], capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"program": False, "seconds": timeout, "kind": "timeout", "reasons": [f"no program in {timeout:.0f} s"]}
    lines = done.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"program": False, "seconds": 0.0, "kind": "crash", "reasons": [f"the compiler process died: {tail}"]}


def run(names: list[str], jobs: int = 1, timeout: float = 300.0) -> dict[str, dict]:
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        paths = write(Path(tmp), names)
        with ThreadPoolExecutor(jobs) as pool:
            pending = {p.stem: pool.submit(_compile_in_child, p, timeout) for p in paths}
            for name, job in pending.items():
                results[name] = job.result()
                mark = "program" if results[name]["program"] else "REFUSED"
                print(f"{name:32s} {mark:8s} {results[name]['seconds']:6.1f} s  "
                      f"{(results[name]['reasons'] or [''])[0][:110]}", flush=True)
    return results


def summary(results: dict[str, dict]) -> tuple[str, list[str]]:
    """The table's summary lines and the layout refusals (the check the compiler owes)."""
    by_library: Counter = Counter()
    done: Counter = Counter()
    for name, r in results.items():
        library = name.split("_", 1)[0]
        by_library[library] += 1
        done[library] += r["program"]
    lines = [f"programs: {sum(done.values())}/{len(results)}  ("
             + ", ".join(f"{lib} {done[lib]}/{n}" for lib, n in sorted(by_library.items())) + ")"]
    first: Counter = Counter()
    anywhere: Counter = Counter()
    layout: list[str] = []
    for name, r in results.items():
        if r["program"]:
            continue
        classes = [reason_class(x) for x in r["reasons"]]
        first[classes[0] if classes else "other"] += 1
        for c in set(classes):
            anywhere[c] += 1
        if r.get("kind") != "capture" and any(LAYOUT_WORDS.search(x) for x in r["reasons"]):
            layout.append(name)
    if first:
        lines.append(f"{'refusal reason':40s} first anywhere")
        lines += [f"{c:40s} {first[c]:5d} {anywhere[c]:8d}" for c in sorted(anywhere, key=lambda c: -anywhere[c])]
    lines.append(f"refusals naming a fusion group or a layout: {len(layout)}" + (f" ({', '.join(layout)})" if layout else ""))
    slow = [n for n, r in results.items() if r["seconds"] > 60]
    lines.append(f"programs over 60 s of CPU: {len(slow)}" + (f" ({', '.join(slow)})" if slow else ""))
    return "\n".join(lines), layout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write", help="write the task files")
    w.add_argument("folder", type=Path)
    r = sub.add_parser("run", help="write a program for each model on the CPU and print the table")
    r.add_argument("--jobs", type=int, default=1)
    r.add_argument("--json", type=Path, help="also write every result (all reasons) here")
    for p in (w, r):
        p.add_argument("--sample", action="store_true", help="only the CI sample")
        p.add_argument("--only", help="comma-separated model names")
    sub.add_parser("coverage", help="the core-ATen forward operators the compiler lowers, and those it does not")
    one = sub.add_parser("one", help="compile one task file, print its result as JSON (run's worker)")
    one.add_argument("path", type=Path)
    args = parser.parse_args()
    if args.command == "one":
        print(json.dumps(_compile_one(str(args.path))))
        return 0
    if args.command == "coverage":
        from stitchcuda.compiler.coverage import coverage

        report = coverage()
        print(f"core-ATen forward operators: {report.total}, lowered {len(report.covered)}, "
              f"missing {len(report.missing)}")
        for how, n in Counter(report.covered.values()).most_common():
            print(f"  {how:40s} {n}")
        print("no lowering: " + (", ".join(report.missing) or "none"))
        return 0
    names = args.only.split(",") if args.only else SAMPLE if args.sample else None
    if args.command == "write":
        for path in write(args.folder, names):
            print(path)
        return 0
    results = run(names or [m.name for m in catalogue()], args.jobs)
    text, _ = summary(results)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
