"""`spec.model` and `spec.engine`: what is served and how the engine runs it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from frota.api.adapters import LoRA
from frota.api.contract import ModelScheme
from frota.api.memory import Dtype, KVCacheDtype, WeightQuantization
from frota.api.types import CelRule, FrotaModel, Quantity, nested_default

SHA256_PATTERN = r"^[0-9a-f]{64}$"
URI_PATTERN = r"^(alias:[a-z0-9][a-z0-9._-]*|pvc://[a-z0-9][a-z0-9.-]*(/.*)?|hf://[^/\s]+/[^/\s]+|https://\S+|synthetic:\S+)$"
DEFAULT_IMAGE = "ghcr.io/frota-dev/frota-worker:0.1.0"


class SecretKeyRef(FrotaModel):
    """A key in a Secret in the InferenceService's namespace."""

    name: str = Field(min_length=1, description="Name of the Secret.")
    key: str = Field(min_length=1, description="Key within the Secret.")


class CABundle(FrotaModel):
    """A ConfigMap key holding PEM certificates to trust for `https://` downloads."""

    name: str = Field(min_length=1, max_length=253, description="Name of the ConfigMap.")
    key: str = Field(
        default="ca.crt", min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$",
        description="Key within the ConfigMap whose value is the PEM bundle.",
    )


class ModelCache(FrotaModel):
    """A PersistentVolumeClaim that one Job fills with the weights, mounted read-only by every worker."""

    enabled: bool = Field(
        default=False,
        description=(
            "Download `hf://`/`https://` weights (and, for the vllm runtime, convert them) once, "
            "by a Job, into a PersistentVolumeClaim `<name>-model-cache` that every worker pod "
            "mounts read-only, instead of once per pod into an emptyDir."
        ),
    )
    size: Quantity = Field(default="20Gi", description="Storage the claim requests.")
    storageClassName: str | None = Field(
        default=None, max_length=253,
        description="StorageClass of the claim; unset: the cluster's default.",
    )
    accessMode: Literal["ReadWriteOnce", "ReadWriteMany"] = Field(
        default="ReadWriteOnce",
        description=(
            "ReadWriteOnce binds the workers to the node the volume attaches to (fine for one "
            "node); ReadWriteMany lets workers on many nodes share it (needs such a storage class)."
        ),
    )


class ModelSource(FrotaModel):
    """The model to serve: the name clients ask for, and where the weights come from."""

    cel_rules = (
        CelRule(
            "!has(self.sha256) || self.uri.startsWith('hf://') || self.uri.startsWith('https://')",
            "sha256 pins a download: it needs an hf:// or https:// uri",
            ".sha256",
        ),
        CelRule(
            "!has(self.sha256) || !self.uri.contains('#sha256=') || self.uri.endsWith('#sha256=' + self.sha256)",
            "sha256 and the uri's #sha256= fragment name different digests: keep one (in lowercase)",
            ".sha256",
        ),
    )

    name: str = Field(
        min_length=1, max_length=128,
        description="Served model name: the `model` field clients send to /v1/completions.",
    )
    uri: str = Field(
        pattern=URI_PATTERN,
        description=(
            "Where the weights come from. `alias:NAME` is a model baked into the worker image "
            "(e.g. `alias:smollm2`); `pvc://CLAIM/PATH` mounts a PersistentVolumeClaim read-only; "
            "`hf://ORG/REPO` and `https://URL` are downloaded by an init container into a cache "
            "volume; `synthetic:PRESET` is a seeded random model of a known shape (tests, MoE)."
        ),
    )
    sha256: str | None = Field(
        default=None, pattern=SHA256_PATTERN,
        description=(
            "The downloaded source's sha256 (64 lowercase hex digits), enforced from the first "
            "download and checked again at every pod start: for a `.gguf` URL the file's (as "
            "`sha256sum` prints it); for an archive URL the archive's; for an `hf://` repository or "
            "a directory URL, which are many files, the directory's: the sha256 of `sha256sum`'s "
            "lines for its files sorted by path, which `frota cache digest DIR` prints for a copy "
            "`frota fetch` wrote. A mismatch fails the download (or the pod start) naming both "
            "digests. Unset: the digests of the first download are recorded and checked from then on "
            "(with spec.model.cache). The uri's `#sha256=` fragment, where both are set, must agree."
        ),
    )
    credentials: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding a token for `hf://`/`https://` downloads (passed as HF_TOKEN).",
    )
    caBundle: CABundle | None = Field(
        default=None,
        description=(
            "ConfigMap key with CA certificates (PEM) to trust, besides the system's, for "
            "`https://` downloads of the model and its adapters: mounted read-only at "
            "/etc/frota/ca/ca.crt in the download init containers and the worker, and named "
            "by SSL_CERT_FILE there."
        ),
    )
    cacheSize: Quantity = Field(
        default="20Gi",
        description="Size limit of the emptyDir cache that `hf://`/`https://` weights are downloaded into.",
    )
    cache: ModelCache | None = Field(
        default=None,
        description="Download the weights once into a shared PersistentVolumeClaim (see ModelCache).",
    )

    @model_validator(mode="after")
    def _sha256_pins_a_download(self) -> ModelSource:
        if self.sha256 is None:
            return self
        if not self.uri.startswith((ModelScheme.HF, "https://")):
            raise ValueError(self.cel_rules[0].message)
        if "#sha256=" in self.uri and not self.uri.endswith("#sha256=" + self.sha256):
            raise ValueError(self.cel_rules[1].message)
        return self


class Quantization(FrotaModel):
    """Quantization of the weights and of the KV cache."""

    weights: WeightQuantization = Field(
        default="none",
        description="Weight quantization of the linear layers: none (the dtype), int8, int4 (grouped), fp8 (accelerator only).",
    )
    kvCache: KVCacheDtype = Field(
        default="auto",
        description="KV cache element type: auto (the dtype), int8, or fp8 (accelerator only).",
    )


class KVCache(FrotaModel):
    """The paged KV cache."""

    blockSize: Literal[8, 16, 32] = Field(default=16, description="Tokens per KV cache block.")
    memoryFraction: float = Field(
        default=0.9, ge=0.1, le=0.98,
        description=(
            "Fraction of each rank's memory (accelerator memory, or the memory request on CPU) the "
            "engine may use for weights plus KV cache; the rest is left for activations and the runtime."
        ),
    )
    prefixCaching: bool = Field(
        default=True, description="Reuse the KV blocks of shared prompt prefixes across requests."
    )


class SchedulerLimits(FrotaModel):
    """Continuous-batching limits of one replica."""

    maxNumSeqs: int = Field(default=64, ge=1, le=4096, description="Most sequences running in one step.")
    maxNumBatchedTokens: int = Field(
        default=2048, ge=16, le=1048576,
        description="Most tokens processed in one step (prefill chunks plus decodes).",
    )
    maxQueue: int = Field(
        default=256, ge=0, le=1000000,
        description="Most requests waiting in a replica's queue before it answers 429.",
    )


class EnvVarSource(FrotaModel):
    """Where an environment variable's value comes from."""

    secretKeyRef: SecretKeyRef | None = Field(default=None, description="A key of a Secret.")
    configMapKeyRef: SecretKeyRef | None = Field(
        default=None, description="A key of a ConfigMap (`name` is the ConfigMap's name)."
    )

    cel_rules = (
        CelRule(
            "has(self.secretKeyRef) != has(self.configMapKeyRef)",
            "exactly one of secretKeyRef and configMapKeyRef must be set",
        ),
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> EnvVarSource:
        if (self.secretKeyRef is None) == (self.configMapKeyRef is None):
            raise ValueError(self.cel_rules[0].message)
        return self


class EnvVar(FrotaModel):
    """An extra environment variable for every worker container."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="Variable name.")
    value: str | None = Field(default=None, description="Literal value.")
    valueFrom: EnvVarSource | None = Field(default=None, description="Value taken from a Secret or ConfigMap.")

    cel_rules = (
        CelRule("!(has(self.value) && has(self.valueFrom))", "set value or valueFrom, not both"),
    )

    @model_validator(mode="after")
    def _not_both(self) -> EnvVar:
        if self.value is not None and self.valueFrom is not None:
            raise ValueError(self.cel_rules[0].message)
        return self


class Engine(FrotaModel):
    """How Frota's engine runs the model on each worker rank."""

    image: str = Field(default=DEFAULT_IMAGE, min_length=1, description="Worker image (also runs the router).")
    imagePullPolicy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="Pull policy of the worker and router containers."
    )
    dtype: Dtype = Field(
        default="auto",
        description="Compute dtype; auto is bfloat16 on an accelerator and on a CPU where it is the faster one (AMX, or AVX-512 BF16 on AMD; decided by each worker on its node), float32 on other CPUs (and always with the vLLM runtime on CPU).",
    )
    maxModelLen: int | None = Field(
        default=None, ge=16, le=1048576,
        description="Longest sequence (prompt plus output) in tokens; default: the model's context length.",
    )
    quantization: Quantization = Field(
        default_factory=Quantization, json_schema_extra=nested_default(Quantization),
        description="Weight and KV cache quantization.",
    )
    kvCache: KVCache = Field(
        default_factory=KVCache, json_schema_extra=nested_default(KVCache),
        description="Paged KV cache settings.",
    )
    scheduler: SchedulerLimits = Field(
        default_factory=SchedulerLimits, json_schema_extra=nested_default(SchedulerLimits),
        description="Continuous-batching limits per replica.",
    )
    lora: LoRA | None = Field(
        default=None,
        description=(
            "LoRA adapter slots; unset: the defaults when spec.adapters lists any, else LoRA off "
            "(no slots reserved)."
        ),
    )
    extraArgs: list[str] = Field(
        default_factory=list, max_length=64,
        description="Extra `frota worker` flags, appended after the ones Frota sets.",
    )
    env: list[EnvVar] = Field(
        default_factory=list, max_length=64,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        description="Extra environment variables for worker containers (FROTA_<FLAG> sets a flag).",
    )
