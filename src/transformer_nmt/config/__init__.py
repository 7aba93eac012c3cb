"""The config layer: the typed schema of every config group, its checks, and composition.

``schema``: the dataclasses of every config group (``data``, ``model``, ``trainer``,
``decode``, ...) and the special token ids, registered in Hydra's ConfigStore on import;
``validate``: the checks typing cannot express; ``table3``: a Table 3 row applied to the
experiment's config; ``compose``: ``configs/config.yaml`` + overrides -> the typed, validated
:class:`Config` (:func:`typed_config` for the entry points, :func:`compose` for tests and
scripts). The closed sets of values are the Enums of :mod:`transformer_nmt.choices`,
re-exported here.
"""

from transformer_nmt.choices import (
    Choice,
    Corpus,
    DecodePrecision,
    EncodingErrors,
    Engine,
    ExportFormat,
    GradCompression,
    Init,
    LenpenForm,
    LrScheduler,
    Norm,
    PlotFormat,
    PlotKind,
    Positions,
    Pretokenize,
    Quantization,
    ReportTable,
    ShareEmbeddings,
    SpmModelType,
    Stopping,
    TooLong,
    TrainPrecision,
    UnicodeForm,
)
from transformer_nmt.config.compose import CONFIG_DIR, check_known_keys, compose, typed_config
from transformer_nmt.config.schema import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    AverageConfig,
    Config,
    DataConfig,
    DecodeConfig,
    ExportConfig,
    ModelConfig,
    PlotConfig,
    Table3Config,
    TableConfig,
    TrainerConfig,
    TranslateConfig,
    as_plain,
    field_value,
    register_configs,
    to_plain,
)
from transformer_nmt.config.table3 import apply_row
from transformer_nmt.config.validate import validate, validate_model_config
from transformer_nmt.errors import ConfigError

__all__ = [
    "BOS_ID", "CONFIG_DIR", "EOS_ID", "PAD_ID", "UNK_ID", "AverageConfig", "Choice", "Config",
    "ConfigError", "Corpus", "DataConfig", "DecodeConfig", "DecodePrecision", "EncodingErrors",
    "Engine", "ExportConfig", "ExportFormat", "GradCompression", "Init", "LenpenForm",
    "LrScheduler", "ModelConfig", "Norm", "PlotConfig", "PlotFormat", "PlotKind", "Positions",
    "Pretokenize", "Quantization", "ReportTable", "ShareEmbeddings", "SpmModelType", "Stopping",
    "Table3Config", "TableConfig", "TooLong", "TrainPrecision", "TrainerConfig", "TranslateConfig",
    "UnicodeForm", "apply_row", "as_plain", "check_known_keys", "compose", "field_value",
    "register_configs", "to_plain", "typed_config", "validate", "validate_model_config",
]
