"""transformer-nmt: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017),
from raw parallel text to BLEU, on one CPU, one GPU, eight GPUs or many nodes."""

__version__ = "0.1.0"
