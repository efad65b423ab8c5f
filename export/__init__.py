"""Export: compact each client's masked model into a smaller dense network, prove it equal, and write it in the
formats the devices run (ONNX, ExecuTorch ``.pte``, TFLite), with a manifest per artifact directory.

The manifest's records and reader are ``edgemask.manifest`` (torch-free, shared with devices and profiling);
they are re-exported here."""

from edgemask.manifest import ArtifactFile, Manifest, TensorSpec, load_artifact, load_manifest, load_sample_io
from edgemask.export.compact import (AllDeadLayerError, CompactionResult, LayerHandler, LayerStat, UnsupportedLayerError,
                            compact, count_flops, count_params, register_handler)
from edgemask.export.formats import DEVICE_PROFILES, FORMATS, ExportFormatError, ExportSettings, FormatUnavailableError
from edgemask.export.layers import layer_records, write_etrecord
from edgemask.export.pipeline import ExportNote, export_client, export_run
from edgemask.export.verify import TOLERANCE, Tolerance, VerificationError, verify_compaction

__all__ = [
    "AllDeadLayerError", "ArtifactFile", "CompactionResult", "DEVICE_PROFILES", "ExportFormatError", "ExportNote",
    "ExportSettings", "FORMATS", "FormatUnavailableError", "LayerHandler", "LayerStat", "Manifest", "TOLERANCE",
    "TensorSpec", "Tolerance", "UnsupportedLayerError", "VerificationError", "compact", "count_flops", "count_params",
    "export_client", "export_run", "layer_records", "load_artifact", "load_manifest", "load_sample_io", "register_handler", "verify_compaction",
    "write_etrecord",
]
