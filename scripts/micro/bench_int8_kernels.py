"""int8 linear layers on a CPU: the product ``decode.precision=int8`` runs (fbgemm, through
:class:`transformer_nmt.decode.quantize.Int8Linear`) against the same computation on oneDNN's
int8 kernel (``torch.ops.onednn.qlinear_pointwise``), with the fp32 packed layer for scale,
at a decoder step's shapes; and whether the oneDNN form's rows depend on the rows around them.

Both int8 forms take the same int8 weights (one scale per output channel) and the same
8-bit codes of each input row divided by its largest magnitude (:data:`ROW_SCALE`,
:data:`ROW_ZERO_POINT`), multiply the row's scale back in and add the bias after the product.
Their results differ only in float32 rounding (printed). For each (rows, in, out) the three run
on the same input, alternating, for ``--rounds`` rounds; the median time of each is printed.
The instruction sets each library may use can be capped from the environment
(``FBGEMM_ENABLE_INSTRUCTIONS=AVX2``, ``ONEDNN_MAX_CPU_ISA=AVX2``), to see an AVX2 machine's
kernels on a newer CPU.

    .venv/bin/python scripts/micro/bench_int8_kernels.py
    .venv/bin/python scripts/micro/bench_int8_kernels.py --rows 12,400 --shapes 256x8000
"""

from __future__ import annotations

import statistics
import warnings

import torch
from bench_prepack import layer_setup, mean_us, rows_alone_differ
from torch import nn

from transformer_nmt.decode.prepack import PackedLinear, prepack_supported
from transformer_nmt.decode.quantize import (
    ROW_SCALE,
    ROW_ZERO_POINT,
    Int8Linear,
    quantize_int8,
)


def onednn_available() -> bool:
    """Whether this PyTorch build has oneDNN's int8 linear kernel."""
    return (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.onednn, "qlinear_pointwise")
            and hasattr(torch.ops.onednn, "qlinear_prepack"))


class OneDNNInt8:
    """The computation of an :class:`Int8Linear` (fixed-scale form) on oneDNN's kernel: the
    same int8 weights and input codes. Shapes: x (R, K) float32 -> (R, N) float32."""

    def __init__(self, layer: Int8Linear) -> None:
        weight = layer.weight()  # (N, K) qint8, per channel
        self.w_scales = weight.q_per_channel_scales().float()  # (N,)
        self.w_zero_points = torch.zeros(weight.size(0), dtype=torch.long)
        self.packed = torch.ops.onednn.qlinear_prepack(weight.int_repr(), None)
        self.bias, self.relu = layer.bias, layer.relu

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        scale = x.abs().amax(dim=1, keepdim=True).clamp_min_(1e-30)  # (R, 1)
        codes = torch.quantize_per_tensor(x / scale, ROW_SCALE, ROW_ZERO_POINT,
                                          torch.quint8).int_repr()  # (R, K) uint8
        y = torch.ops.onednn.qlinear_pointwise(
            codes, ROW_SCALE, ROW_ZERO_POINT, self.packed, self.w_scales, self.w_zero_points,
            None, 1.0, 0, torch.float32, "none", [], "")  # (R, N)
        if self.bias is None:
            y.mul_(scale)
        else:
            torch.addcmul(self.bias, y, scale, out=y)
        return y.relu_() if self.relu else y


def _int8_layer(linear: nn.Linear) -> Int8Linear:
    copy = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
    copy.load_state_dict(linear.state_dict())
    model = quantize_int8(nn.Sequential(copy))
    assert isinstance(model[0], Int8Linear) and model[0].fixed_scale
    return model[0]


def main(argv: list[str] | None = None) -> None:
    args, shapes = layer_setup(argv, __doc__.split("\n")[0], "12,100,400,1500",
                               "1,2,3,7,12,100", onednn_available(),
                               "this PyTorch build has no oneDNN int8 linear kernel")
    packs = prepack_supported()
    print("| rows | in x out | fp32 packed (us) | int8 fbgemm (us) | int8 oneDNN (us) | "
          "fbgemm / oneDNN | max diff |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch's deprecation notes on its quantization API
        layers = {}
        for k, n in shapes:
            linear = nn.Linear(k, n).eval()
            fbgemm = _int8_layer(linear)
            layers[k, n] = onednn = OneDNNInt8(fbgemm)
            fp32 = PackedLinear(linear) if packs else linear
            for rows in (int(r) for r in args.rows.split(",")):
                x = torch.randn(rows, k)
                diff = float((onednn(x) - fbgemm(x)).abs().max())
                calls = max(3, int(3e7 / (rows * k * n) + 1))
                times: dict[str, list[float]] = {"fp32": [], "fbgemm": [], "onednn": []}
                for _ in range(args.rounds):
                    for name, fn in (("fp32", fp32), ("fbgemm", fbgemm), ("onednn", onednn)):
                        times[name].append(mean_us(lambda fn=fn: fn(x), calls))
                a, b, c = (statistics.median(times[m]) for m in ("fp32", "fbgemm", "onednn"))
                print(f"| {rows} | {k} x {n} | {a:,.0f} | {b:,.0f} | {c:,.0f} | {b / c:.2f} | "
                      f"{diff:.1e} |", flush=True)
        print("\nrows whose oneDNN int8 product alone differs from the same rows of a 300-row "
              "product:")
        for (k, n), onednn in layers.items():
            print(f"  {k} x {n}: {rows_alone_differ(onednn, k, args.alone)}")


if __name__ == "__main__":
    main()
