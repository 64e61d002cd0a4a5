"""Builders for the model zoo: real architectures with random weights and small inputs.

``ZOO`` lists :class:`ZooModel` entries. ``entry.build()`` returns ``(model, args, kwargs)``:
a freshly built model (seeded, so two calls give the same weights) and deterministic inputs for
``tl.log_forward_pass(model, args, kwargs)``. Nothing is downloaded: torchvision models are built
with ``weights=None``, HuggingFace models from small configs, timm models with
``pretrained=False``.

Used by ``tests/test_zoo.py`` and ``benchmarks/zoo_table.py``. Entries not in ``FAST`` (the
ones whose zoo test took under ``FAST_SECONDS`` on the 2-core CI machine) are marked ``slow``.
Entries in ``XFAIL`` fail because of a known torchlens bug, described in ``BUGS``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

Built = Tuple[nn.Module, tuple, Dict[str, Any]]

FAST_SECONDS = 0.5
SEED = 0


@dataclass(frozen=True)
class ZooModel:
    name: str  # unique id, e.g. "tv.resnet18"
    family: str  # see FAMILIES
    build: Callable[[], Built]
    slow: bool = True  # not in FAST: marked slow in the tests
    xfail: Optional[str] = None  # a known torchlens bug: the reason (tests use strict xfail)
    note: str = ""  # input size / configuration, for the table


FAMILIES = ("classification", "detection", "segmentation", "video", "optical_flow", "transformers", "timm", "recurrent")


def _seeded(build: Callable[[], Built]) -> Callable[[], Built]:
    def wrapped() -> Built:
        torch.manual_seed(SEED)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, args, kwargs = build()
        return model, tuple(args), dict(kwargs)

    wrapped.__name__ = getattr(build, "__name__", "build")
    return wrapped


def _images(*shape: int) -> torch.Tensor:
    return torch.rand(*shape)


# ----- torchvision classification ---------------------------------------------------------------
# model name -> (input size (H = W), extra builder keyword arguments). Default: 64 x 64.
_TV_CLASSIFICATION_SPECIAL: Dict[str, Tuple[int, Dict[str, Any]]] = {
    "googlenet": (64, dict(aux_logits=False, init_weights=True)),
    "inception_v3": (75, dict(aux_logits=False, init_weights=True)),
    "maxvit_t": (224, {}),
    **{name: (32, dict(image_size=32)) for name in ("vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32")},
    "vit_h_14": (28, dict(image_size=28)),
}


def _tv_classification(
    name: str, train: bool = False, batch: int = 1, override: Optional[Dict[str, Any]] = None
) -> Callable[[], Built]:
    size, extra = _TV_CLASSIFICATION_SPECIAL.get(name, (64, {}))
    extra = {**extra, **(override or {})}

    def build() -> Built:
        import torchvision

        model = torchvision.models.get_model(name, weights=None, **extra)
        model.train(train)
        return model, (_images(batch, 3, size, size),), {}

    return build


def tv_classification_names() -> List[str]:
    import torchvision

    return list(torchvision.models.list_models(module=torchvision.models))


# ----- torchvision detection -------------------------------------------------------------------
def _det_targets(name: str, n_images: int, height: int, width: int) -> List[Dict[str, torch.Tensor]]:
    """Two boxes per image (plus masks / keypoints for the models that need them)."""
    targets = []
    for i in range(n_images):
        xy = torch.tensor([[4.0, 6.0], [width / 2, height / 3]]) + i
        wh = torch.tensor([[width / 3, height / 4], [width / 4, height / 2]])
        boxes = torch.cat([xy, xy + wh], 1)
        target = {"boxes": boxes, "labels": torch.tensor([1, 3])}
        if name.startswith("maskrcnn"):
            masks = torch.zeros(2, height, width, dtype=torch.uint8)
            for k, (x0, y0, x1, y1) in enumerate(boxes.long().tolist()):
                masks[k, y0:y1, x0:x1] = 1
            target["masks"] = masks
        if name.startswith("keypointrcnn"):
            centre = (boxes[:, :2] + boxes[:, 2:]) / 2
            points = torch.stack([boxes[:, :2] + 1, centre, boxes[:, 2:] - 1], 1)  # 3 keypoints
            target["keypoints"] = torch.cat([points, torch.ones(2, 3, 1)], 2)
        targets.append(target)
    return targets


# small proposal counts keep the region heads (and the graph) small
_RCNN_SMALL = dict(
    rpn_pre_nms_top_n_train=200,
    rpn_post_nms_top_n_train=50,
    rpn_pre_nms_top_n_test=100,
    rpn_post_nms_top_n_test=30,
    box_batch_size_per_image=32,
    box_detections_per_img=5,
)


def _tv_detection(name: str, size: int, train: bool, extra: Dict[str, Any]) -> Callable[[], Built]:
    def build() -> Built:
        import torchvision

        model = torchvision.models.get_model(name, weights=None, weights_backbone=None, num_classes=5, **extra)
        model.train(train)
        images = [_images(3, size, size), _images(3, size - 16, size)]
        if train:
            return model, (images, _det_targets(name, len(images), size - 16, size)), {}
        return model, (images,), {}

    return build


# name -> (image size, builder keyword arguments)
_TV_DETECTION: Dict[str, Tuple[int, Dict[str, Any]]] = {
    "fasterrcnn_mobilenet_v3_large_320_fpn": (128, dict(min_size=128, max_size=128, **_RCNN_SMALL)),
    "fasterrcnn_resnet50_fpn": (96, dict(min_size=96, max_size=96, **_RCNN_SMALL)),
    "maskrcnn_resnet50_fpn": (96, dict(min_size=96, max_size=96, **_RCNN_SMALL)),
    "keypointrcnn_resnet50_fpn": (96, dict(min_size=96, max_size=96, num_keypoints=3, **_RCNN_SMALL)),
    "retinanet_resnet50_fpn": (96, dict(min_size=96, max_size=96, topk_candidates=50, detections_per_img=20)),
    "fcos_resnet50_fpn": (96, dict(min_size=96, max_size=96, topk_candidates=50, detections_per_img=20)),
    "ssdlite320_mobilenet_v3_large": (128, {}),  # resized to 320 x 320 inside
    "ssd300_vgg16": (128, {}),  # resized to 300 x 300 inside
}


# ----- torchvision segmentation, video, optical flow -------------------------------------------
def _tv_segmentation(name: str, size: int, extra: Dict[str, Any]) -> Callable[[], Built]:
    def build() -> Built:
        import torchvision

        model = torchvision.models.get_model(name, weights=None, weights_backbone=None, num_classes=5, **extra)
        return model.eval(), (_images(1, 3, size, size),), {}

    return build


def _tv_video(name: str, shape: Tuple[int, ...], extra: Dict[str, Any]) -> Callable[[], Built]:
    def build() -> Built:
        import torchvision

        model = torchvision.models.get_model(name, weights=None, num_classes=10, **extra)
        return model.eval(), (_images(*shape),), {}

    return build


def _tv_mvit(name: str, frames: int, size: int) -> Callable[[], Built]:
    """MViT with a smaller input than its builder allows: ``mvit_v1_b``/``mvit_v2_s`` hard-code
    ``spatial_size=(224, 224), temporal_size=16`` (the size of the positional embeddings); the
    builder is run with those two values replaced, the blocks are those of the named model."""

    def build() -> Built:
        from unittest import mock

        from torchvision.models.video import mvit

        real = mvit._mvit

        def smaller(**kwargs: Any):
            kwargs.update(spatial_size=(size, size), temporal_size=frames)
            return real(**kwargs)

        with mock.patch.object(mvit, "_mvit", smaller):
            model = getattr(mvit, name)(weights=None, num_classes=10)
        return model.eval(), (_images(1, 3, frames, size, size),), {}

    return build


def _tv_flow(name: str, size: int, updates: int) -> Callable[[], Built]:
    def build() -> Built:
        import torchvision

        model = torchvision.models.get_model(name, weights=None).eval()
        return model, (_images(1, 3, size, size), _images(1, 3, size, size)), {"num_flow_updates": updates}

    return build


# ----- HuggingFace transformers (random weights from small configs) ---------------------------
def _ids(batch: int, length: int, vocab: int = 100) -> torch.Tensor:
    return torch.randint(3, vocab, (batch, length))


def _mask(batch: int, length: int) -> torch.Tensor:
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[-1, -2:] = 0  # some padding, so the mask matters
    return mask


def _hf_gpt2(attention: Optional[str] = None) -> Callable[[], Built]:
    def build() -> Built:
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32, bos_token_id=1, eos_token_id=2
        )
        if attention:
            config._attn_implementation = attention
        return GPT2LMHeadModel(config).eval(), (), {"input_ids": _ids(2, 8), "attention_mask": _mask(2, 8)}

    return build


def _hf_bert(train: bool) -> Callable[[], Built]:
    def build() -> Built:
        from transformers import BertConfig, BertForSequenceClassification

        config = BertConfig(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            vocab_size=100,
            max_position_embeddings=32,
            num_labels=3,
        )
        model = BertForSequenceClassification(config).train(train)
        return (
            model,
            (),
            {
                "input_ids": _ids(2, 8),
                "attention_mask": _mask(2, 8),
                "token_type_ids": torch.zeros(2, 8, dtype=torch.long),
            },
        )

    return build


def _hf_t5() -> Built:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=100,
        d_model=64,
        d_kv=16,
        d_ff=128,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    return (
        T5ForConditionalGeneration(config).eval(),
        (),
        {"input_ids": _ids(2, 8), "attention_mask": _mask(2, 8), "decoder_input_ids": _ids(2, 5)},
    )


def _hf_vit() -> Built:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        num_labels=5,
    )
    return ViTForImageClassification(config).eval(), (), {"pixel_values": _images(1, 3, 32, 32)}


def _hf_clip() -> Built:
    from transformers import CLIPConfig, CLIPModel

    config = CLIPConfig(
        text_config=dict(
            vocab_size=100,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=16,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        ),
        vision_config=dict(
            image_size=32,
            patch_size=8,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
        ),
        projection_dim=32,
    )
    return (
        CLIPModel(config).eval(),
        (),
        {"input_ids": _ids(2, 8), "attention_mask": _mask(2, 8), "pixel_values": _images(2, 3, 32, 32)},
    )


def _hf_llama(attention: Optional[str] = None) -> Callable[[], Built]:
    def build() -> Built:
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            vocab_size=100,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=32,
        )
        if attention:
            config._attn_implementation = attention
        return LlamaForCausalLM(config).eval(), (), {"input_ids": _ids(2, 8), "attention_mask": _mask(2, 8)}

    return build


def _hf_whisper() -> Built:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig(
        vocab_size=100,
        num_mel_bins=16,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_source_positions=16,
        max_target_positions=16,
        decoder_start_token_id=1,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    # the encoder wants exactly 2 * max_source_positions frames
    return (
        WhisperForConditionalGeneration(config).eval(),
        (),
        {"input_features": torch.randn(1, 16, 32), "decoder_input_ids": _ids(1, 5)},
    )


# ----- timm (models not in torchvision) --------------------------------------------------------
def _timm(name: str, size: int, extra: Dict[str, Any]) -> Callable[[], Built]:
    def build() -> Built:
        import timm

        model = timm.create_model(name, pretrained=False, num_classes=10, **extra).eval()
        x = _images(1, 3, size, size)
        if name.startswith("levit"):
            # in eval mode LeViT's attention caches attention_biases[:, idxs] on its first call:
            # one plain call first, so that every pass runs the same operations
            with torch.no_grad():
                model(x)
        return model, (x,), {}

    return build


# (zoo name, timm model name, image size, create_model keyword arguments)
_TIMM: List[Tuple[str, str, int, Dict[str, Any]]] = [
    ("convmixer_768_32", "convmixer_768_32", 64, {}),
    ("coatnet_nano_rw_224", "coatnet_nano_rw_224", 64, dict(img_size=64)),
    ("mixer_s32_224", "mixer_s32_224", 64, dict(img_size=64)),
    ("resmlp_12_224", "resmlp_12_224", 64, dict(img_size=64)),
    ("levit_128s", "levit_128s", 128, dict(img_size=128)),
    # at 64 x 64 the last stage has a single token: its attention softmax is over one element
    ("levit_128s.64px", "levit_128s", 64, dict(img_size=64)),
    ("mobilevit_xxs", "mobilevit_xxs", 128, {}),
    # at 64 x 64 the last transformer sees one patch: its attention softmax is over one element
    ("mobilevit_xxs.64px", "mobilevit_xxs", 64, {}),
    ("poolformer_s12", "poolformer_s12", 64, {}),
    ("xcit_nano_12_p16_224", "xcit_nano_12_p16_224", 64, dict(img_size=64)),
    ("beit_base_patch16_224", "beit_base_patch16_224", 64, dict(img_size=64, depth=2)),
    ("eva02_tiny_patch14_224", "eva02_tiny_patch14_224", 56, dict(img_size=56)),
    ("ghostnet_100", "ghostnet_100", 64, {}),
    ("hrnet_w18_small", "hrnet_w18_small", 64, {}),
    ("nfnet_l0", "nfnet_l0", 64, {}),
    ("crossvit_tiny_240", "crossvit_tiny_240", 240, {}),
    ("tnt_s_patch16_224", "tnt_s_patch16_224", 64, dict(img_size=64)),
]


# ----- recurrent and sequence models (plain torch) --------------------------------------------
class RecurrentHead(nn.Module):
    """An ``nn.LSTM``/``GRU``/``RNN`` (2 layers, bidirectional) followed by a linear read-out."""

    def __init__(self, kind: str):
        super().__init__()
        self.rnn = getattr(nn, kind)(input_size=8, hidden_size=16, num_layers=2, batch_first=True, bidirectional=True)
        self.out = nn.Linear(32, 4)

    def forward(self, x):
        sequence, _ = self.rnn(x)
        return self.out(sequence[:, -1])


class LSTMCellLoop(nn.Module):
    """An ``nn.LSTMCell`` unrolled by hand over the time steps."""

    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(8, 16)
        self.out = nn.Linear(16, 4)

    def forward(self, x):
        h = x.new_zeros(x.shape[0], 16)
        c = x.new_zeros(x.shape[0], 16)
        for t in range(x.shape[1]):
            h, c = self.cell(x[:, t], (h, c))
        return self.out(h)


class PackedLSTM(nn.Module):
    """Variable-length sequences: pack_padded_sequence -> LSTM -> pad_packed_sequence."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 8)
        self.lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)
        self.out = nn.Linear(16, 4)

    def forward(self, x, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(self.embed(x), lengths, batch_first=True, enforce_sorted=False)
        sequence, (h, _) = self.lstm(packed)
        padded, _ = nn.utils.rnn.pad_packed_sequence(sequence, batch_first=True)
        return self.out(padded).sum(1) + self.out(h[-1])


def _recurrent(kind: str) -> Built:
    return RecurrentHead(kind).eval(), (torch.randn(3, 5, 8),), {}


def _lstm_cell() -> Built:
    return LSTMCellLoop().eval(), (torch.randn(3, 5, 8),), {}


def _packed_lstm() -> Built:
    return PackedLSTM().eval(), (torch.randn(3, 6, 8), torch.tensor([6, 2, 4])), {}


def _transformer_encoder(train: bool) -> Callable[[], Built]:
    def build() -> Built:
        layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True)
        model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).train(train)
        padding = torch.zeros(2, 6, dtype=torch.bool)
        padding[1, -2:] = True
        return model, (torch.randn(2, 6, 32),), {"src_key_padding_mask": padding}

    return build


def _transformer() -> Built:
    model = nn.Transformer(
        d_model=32, nhead=4, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=64, batch_first=True
    ).eval()
    mask = nn.Transformer.generate_square_subsequent_mask(4)
    return model, (torch.randn(2, 6, 32), torch.randn(2, 4, 32)), {"tgt_mask": mask}


# ----- the zoo ----------------------------------------------------------------------------------
def _zoo() -> List[ZooModel]:
    zoo: List[ZooModel] = []

    def add(name: str, family: str, build: Callable[[], Built], note: str = "") -> None:
        reason = "; ".join(BUGS[key] for key in XFAIL[name]) if name in XFAIL else None
        zoo.append(ZooModel(name, family, _seeded(build), name not in FAST, reason, note))

    for name in tv_classification_names():
        size, extra = _TV_CLASSIFICATION_SPECIAL.get(name, (64, {}))
        add(f"tv.{name}", "classification", _tv_classification(name), f"1x3x{size}x{size}, eval")
    for name, override in TV_CLASSIFICATION_TRAIN.items():
        size, extra = _TV_CLASSIFICATION_SPECIAL.get(name, (64, {}))
        shown = "".join(f", {k}={v}" for k, v in override.items())
        add(
            f"tv.{name}.train",
            "classification",
            _tv_classification(name, True, 2, override),
            f"2x3x{size}x{size}, train mode{shown}",
        )
    for name, (size, extra) in _TV_DETECTION.items():
        for train in (False, True):
            add(
                f"tv.{name}.{'train' if train else 'eval'}",
                "detection",
                _tv_detection(name, size, train, extra),
                f"2 images {size}x{size} + {size - 16}x{size}" + (", with targets" if train else ""),
            )
    for name, size, extra in (
        ("fcn_resnet50", 64, dict(aux_loss=True)),
        ("deeplabv3_resnet50", 64, {}),
        ("deeplabv3_mobilenet_v3_large", 64, {}),
        ("lraspp_mobilenet_v3_large", 64, {}),
    ):
        add(f"tv.{name}", "segmentation", _tv_segmentation(name, size, extra), f"1x3x{size}x{size}, eval")
    for name, shape, extra in (
        ("r3d_18", (1, 3, 4, 32, 32), {}),
        ("mc3_18", (1, 3, 4, 32, 32), {}),
        ("r2plus1d_18", (1, 3, 4, 32, 32), {}),
        ("s3d", (1, 3, 16, 224, 224), {}),
        ("swin3d_t", (1, 3, 4, 64, 64), {}),
    ):
        add(f"tv.{name}", "video", _tv_video(name, shape, extra), "x".join(map(str, shape)) + ", eval")
    for name in ("mvit_v1_b", "mvit_v2_s"):
        add(f"tv.{name}", "video", _tv_mvit(name, 4, 64), "1x3x4x64x64 (builder's sizes replaced), eval")
    add("tv.raft_small", "optical_flow", _tv_flow("raft_small", 128, 2), "2 x 1x3x128x128, 2 flow updates")
    add("tv.raft_large", "optical_flow", _tv_flow("raft_large", 128, 2), "2 x 1x3x128x128, 2 flow updates")

    add("hf.gpt2", "transformers", _hf_gpt2(), "2 layers, d=64; input_ids 2x8 + attention_mask")
    add("hf.gpt2.eager", "transformers", _hf_gpt2("eager"), "as hf.gpt2, eager attention (no sdpa)")
    add("hf.bert", "transformers", _hf_bert(False), "2 layers, d=64; input_ids, attention_mask, token_type_ids")
    add("hf.bert.train", "transformers", _hf_bert(True), "as hf.bert, train mode (dropout)")
    add("hf.t5", "transformers", _hf_t5, "2+2 layers, d=64; input_ids, attention_mask, decoder_input_ids")
    add("hf.vit", "transformers", _hf_vit, "2 layers, d=64; pixel_values 1x3x32x32")
    add("hf.clip", "transformers", _hf_clip, "2+2 layers, d=64; input_ids, attention_mask, pixel_values")
    add("hf.llama", "transformers", _hf_llama(), "2 layers, d=64, GQA 4/2 heads; input_ids + attention_mask")
    add("hf.llama.eager", "transformers", _hf_llama("eager"), "as hf.llama, eager attention (no sdpa)")
    add("hf.whisper", "transformers", _hf_whisper, "2+2 layers, d=64; input_features 1x16x32, decoder_input_ids")

    for zoo_name, name, size, extra in _TIMM:
        shown = "".join(f", {k}={v}" for k, v in extra.items())
        add(f"timm.{zoo_name}", "timm", _timm(name, size, extra), f"1x3x{size}x{size}{shown}")

    for kind in ("LSTM", "GRU", "RNN"):
        add(f"nn.{kind}", "recurrent", lambda kind=kind: _recurrent(kind), "2 layers, bidirectional; 3x5x8")
    add("nn.LSTMCell", "recurrent", _lstm_cell, "unrolled over 5 steps")
    add("nn.LSTM.packed", "recurrent", _packed_lstm, "pack_padded_sequence, lengths 6/2/4")
    add("nn.TransformerEncoder", "recurrent", _transformer_encoder(False), "2 layers, d=32, key padding mask")
    add("nn.TransformerEncoder.train", "recurrent", _transformer_encoder(True), "as above, train mode")
    add("nn.Transformer", "recurrent", _transformer, "2+2 layers, d=32, causal tgt_mask")
    return zoo


# classification models also run in train mode (batch-norm statistics, dropout, stochastic depth)
# (batch of 2: batch norm in training mode needs more than one value per channel)
TV_CLASSIFICATION_TRAIN: Dict[str, Dict[str, Any]] = {
    "resnet18": {},
    "googlenet": dict(aux_logits=True),
    "inception_v3": {},
    "efficientnet_b0": {},
    "convnext_tiny": {},
    "swin_t": {},
    "vit_b_16": {},
    "mobilenet_v3_small": {},
    "densenet121": {},
}

# torchvision classification models not in the zoo: name -> why. (Empty: all of them fit in the
# time budget; tests/test_zoo.py checks that every model of torchvision is either in or here.)
TV_CLASSIFICATION_LEFT_OUT: Dict[str, str] = {}

# Entries whose zoo test took under FAST_SECONDS (benchmarks/zoo_table.py, 2-core machine): not
# marked slow, so `pytest -m "not slow"` still runs a cross-section of the zoo. Every other
# entry -- including any new one until it is measured -- is slow.
FAST = frozenset(
    """
    tv.googlenet tv.mnasnet0_5 tv.mnasnet0_75 tv.mnasnet1_0 tv.mnasnet1_3 tv.mobilenet_v2
    tv.mobilenet_v3_large tv.mobilenet_v3_small tv.regnet_y_400mf tv.regnet_y_800mf tv.resnet18
    tv.resnet34 tv.shufflenet_v2_x0_5 tv.shufflenet_v2_x1_0 tv.shufflenet_v2_x1_5 tv.shufflenet_v2_x2_0
    tv.squeezenet1_0 tv.squeezenet1_1 tv.resnet18.train tv.mobilenet_v3_small.train
    tv.deeplabv3_mobilenet_v3_large tv.lraspp_mobilenet_v3_large tv.mc3_18
    hf.bert hf.bert.train hf.t5 hf.vit hf.clip hf.llama hf.llama.eager hf.gpt2.eager hf.whisper
    timm.beit_base_patch16_224
    nn.LSTM nn.GRU nn.RNN nn.LSTMCell nn.LSTM.packed nn.TransformerEncoder nn.TransformerEncoder.train
    nn.Transformer
""".split()
)

# Known failures of validate_model_activations: bug key -> description. Empty: the last five
# (a result that legitimately ignores a parent's values for the zoo's inputs: clamp(min=k, max=k)
# in MultiScaleRoIAlign's LevelMapper, a float equality no perturbation makes true, a softmax over
# a single token in LeViT / MobileViT) were false alarms of a perturbation check on recorded
# parents, which validation no longer makes (see torchlens/validate.py).
BUGS: Dict[str, str] = {}

# entry -> keys of BUGS: strict xfail (raises=ValidationFailed) in tests/test_zoo.py
XFAIL: Dict[str, Tuple[str, ...]] = {}


ZOO: List[ZooModel] = _zoo()
ZOO_BY_NAME: Dict[str, ZooModel] = {entry.name: entry for entry in ZOO}
