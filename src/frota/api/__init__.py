"""The InferenceService API (`frota.dev/v1alpha1`): pydantic models, the source of truth of the CRD."""

from frota.api.adapters import Adapter, LoRA
from frota.api.contract import API_VERSION, GROUP, KIND, PLURAL, VERSION
from frota.api.engine import (
    Engine,
    EnvVar,
    KVCache,
    ModelSource,
    Quantization,
    SchedulerLimits,
    SecretKeyRef,
)
from frota.api.fleet import (
    Accelerator,
    Admission,
    Autoscaling,
    Disaggregation,
    Parallelism,
    Placement,
    Resources,
    RoleAutoscaling,
    RoleSpec,
    Rollout,
    Router,
    ScaleToZero,
    ScalingPolicy,
    Toleration,
)
from frota.api.resource import InferenceService, ObjectMeta
from frota.api.spec import InferenceServiceSpec
from frota.api.status import AdapterStatus, Capacity, Condition, InferenceServiceStatus, RoleStatus

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "Accelerator",
    "Adapter",
    "AdapterStatus",
    "Admission",
    "Autoscaling",
    "Capacity",
    "Condition",
    "Disaggregation",
    "Engine",
    "EnvVar",
    "InferenceService",
    "InferenceServiceSpec",
    "InferenceServiceStatus",
    "KVCache",
    "LoRA",
    "ModelSource",
    "ObjectMeta",
    "Parallelism",
    "Placement",
    "Quantization",
    "Resources",
    "RoleAutoscaling",
    "RoleSpec",
    "RoleStatus",
    "Rollout",
    "Router",
    "ScaleToZero",
    "ScalingPolicy",
    "SchedulerLimits",
    "SecretKeyRef",
    "Toleration",
]
