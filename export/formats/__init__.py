"""Export formats, one module each, registered in :data:`FORMATS` (``onnx``, ``pte``, ``tflite``; the training steps ``pte-train``, ``torch-train``)."""

from edgemask.export.formats.base import (DEVICE_PROFILES, FORMATS, DeviceProfile, ExportFormatError, ExportSettings, Format,
                                 FormatContext, FormatRuntimeError, FormatUnavailableError, LayerUnsupportedError)
from edgemask.export.formats import onnx, pte, tflite, training  # noqa: F401,E402  (register the formats)

__all__ = ["DEVICE_PROFILES", "FORMATS", "DeviceProfile", "ExportFormatError", "ExportSettings", "Format",
           "FormatContext", "FormatRuntimeError", "FormatUnavailableError", "LayerUnsupportedError"]
