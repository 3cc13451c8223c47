#!/usr/bin/env python3
"""Regenerates tests/fixtures/quant/nf4.safetensors: bitsandbytes' NF4 quantisation of a few weights, on its CPU
backend, for nf4_test.cc to compare ours with byte for byte.

For each weight <w> (bf16, element counts multiples of 64, `edge` with a block of zeros and an outlier; `ties`
fp32, with values exactly on the midpoints between NF4 codes and next to them):
  <w>.input                 bf16 [rows, cols]
  <w>.packed, <w>.absmax    bitsandbytes.functional.quantize_4bit(quant_type="nf4", blocksize=64)
  <w>.dequant               dequantize_4bit of that state, bf16: bitsandbytes' default (and CUDA) semantics, blocks
                            over the flattened weight. Its CPU library's kernel, which functional.dequantize_4bit calls
                            on the CPU, takes each row's blocks as starting at the row (row * (cols / 64) + col / 64):
                            the same where cols is a multiple of 64 (checked here), wrong for `wide` (cols 160), so
                            the default backend's computation is what is recorded
  <w>.dq.codes, .dq.absmax2, .dq.offset, .dq.dequant   the same with compress_statistics=True
                            (double quantisation: the absmax values less their mean, 8-bit blockwise in blocks of 256)
plus code.nf4 (the 16 NF4 values) and map.signed (the dynamic map the statistics use).

Usage: scripts/make_nf4_fixtures.py   (pip: torch==2.11.0 bitsandbytes==0.50.2 safetensors)
"""
import os

import bitsandbytes as bnb
import torch
from bitsandbytes import functional as F
from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "quant", "nf4.safetensors")


def weights():
    g = torch.Generator().manual_seed(20261207)
    w = {"small": torch.randn(32, 64, generator=g) * 0.02,           # 32 blocks
         "wide": torch.randn(96, 160, generator=g) * 0.05,           # 240 blocks: one statistics block, partial
         "many": torch.randn(320, 256, generator=g) * 0.03}          # 1280 blocks: five statistics blocks
    edge = torch.randn(16, 64, generator=g)
    edge[3] = 0.0                                                   # a block of zeros
    edge[7, 10] = 40.0                                              # one outlier dominates its block
    w = {k: v.to(torch.bfloat16) for k, v in w.items()}
    w["edge"] = edge.to(torch.bfloat16)
    # fp32: blocks of absmax 1 whose other values lie exactly on the midpoints between NF4 codes (computed as
    # bitsandbytes computes them, in fp32) and just either side of them.
    code = F.get_4bit_type("nf4", device="cpu")
    mids = (code[:-1] + code[1:]) / 2
    ties = torch.zeros(4, 64)
    ties[:, 63] = 1.0
    ties[0, :15] = mids
    ties[0, 15:30] = -mids
    ties[1, :15] = torch.nextafter(mids, torch.full_like(mids, 2.0))
    ties[1, 15:30] = torch.nextafter(mids, torch.full_like(mids, -2.0))
    ties[2, :15] = mids * 0.5                                       # absmax 0.5: scaled by 1 / 0.5 = 2
    ties[2, 63] = 0.5
    ties[3, :63] = torch.linspace(-1, 1, 63)
    w["ties"] = ties
    return w


def main():
    t = {"code.nf4": F.get_4bit_type("nf4", device="cpu").float().contiguous(),
         "map.signed": F.create_dynamic_map(signed=True).float().contiguous()}
    for name, x in weights().items():
        t[f"{name}.input"] = x.contiguous()
        packed, state = F.quantize_4bit(x, blocksize=64, quant_type="nf4", compress_statistics=False)
        t[f"{name}.packed"] = packed.reshape(-1).contiguous()
        t[f"{name}.absmax"] = state.absmax.float().contiguous()
        code = F.get_4bit_type("nf4", device="cpu")

        def dequant(absmax):
            return _dequantize_4bit_compute(packed.reshape(-1), absmax, code, 64, x.shape, torch.bfloat16)
        t[f"{name}.dequant"] = dequant(state.absmax).contiguous()
        if x.shape[-1] % 64 == 0:
            assert torch.equal(F.dequantize_4bit(packed, state).to(torch.bfloat16), t[f"{name}.dequant"])
        packed2, s2 = F.quantize_4bit(x, blocksize=64, quant_type="nf4", compress_statistics=True)
        assert torch.equal(packed2, packed)
        t[f"{name}.dq.codes"] = s2.absmax.contiguous()
        t[f"{name}.dq.absmax2"] = s2.state2.absmax.float().contiguous()
        t[f"{name}.dq.offset"] = s2.offset.reshape(1).float().contiguous()
        scales = F.dequantize_blockwise(s2.absmax, s2.state2) + s2.offset
        t[f"{name}.dq.dequant"] = dequant(scales).contiguous()
        if x.shape[-1] % 64 == 0:
            assert torch.equal(F.dequantize_4bit(packed2, s2).to(torch.bfloat16), t[f"{name}.dq.dequant"])
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    save_file(t, OUT, metadata={"bitsandbytes": bnb.__version__, "torch": torch.__version__})
    print(f"{OUT}: {len(t)} tensors (bitsandbytes {bnb.__version__}, torch {torch.__version__})")


if __name__ == "__main__":
    main()
