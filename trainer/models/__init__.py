"""Models and the masked-layer semantics. Importing this package registers every model."""

from edgemask.trainer.models.masking import MaskedModel, MaskSite, bake, effective_params, find_sites, masked_forward
from edgemask.trainer.models.registry import MODELS, NormMapError, build_model, head_names, model_sites, norms_after
from edgemask.trainer.models import small  # noqa: F401  (registers mlp, cnn)
from edgemask.trainer.models import zoo  # noqa: F401  (registers the papers' models)

__all__ = [
    "MODELS", "MaskSite", "MaskedModel", "bake", "build_model", "effective_params", "find_sites",
    "NormMapError", "head_names", "masked_forward", "model_sites", "norms_after",
]
