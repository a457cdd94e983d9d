"""The launcher this Lab is configured with (``LAB_LAUNCHER``)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from environments import build_clusters
from environments.build_clusters import REPORT_GRACE_S
from environments.conf import setting
from jobs import storage
from jobs.launchers.base import Launcher
from jobs.launchers.kubernetes.builds import BuildSettings, KubernetesBuilds
from jobs.launchers.local import LocalLauncher


def _local_launcher() -> LocalLauncher:
    """Return the local launcher for the current settings (cheap: it holds paths only, and the
    storage it hands a sandbox follows ``STORAGES`` as it is now)."""
    data_dir = Path(settings.LAB_DATA_DIR)
    return LocalLauncher(
        runs_dir=data_dir / "runs",
        repo_dir=Path(settings.BASE_DIR),
        isolation=settings.LAB_LOCAL_ISOLATION,
        data_dir=data_dir,
        model_dir=Path(settings.LAB_MODEL_DIR),
        allow_private_egress=settings.LAB_ENGINE_EGRESS_ALLOW_PRIVATE,
        sandbox_data_plane_url=settings.LAB_SANDBOX_DATA_PLANE_URL,
        **_local_storage(),
    )


@cache
def _launcher(kind: str) -> Launcher:
    if kind == "kubernetes":
        from jobs.launchers.kubernetes.gateway import KubernetesGateway
        from jobs.launchers.kubernetes.launcher import KubernetesLauncher

        return KubernetesLauncher(gateway=KubernetesGateway(), settings=kubernetes_pool_settings())
    raise ImproperlyConfigured(f"LAB_LAUNCHER={kind!r} is not available in this build")


def _local_storage() -> dict:
    """Return where a sandboxed local engine reaches object storage: the filesystem backend's root
    (``storage_root``), or the origin an object store's signed URLs point at (``storage_origin``)."""
    if storage.is_filesystem():
        return {"storage_root": Path(storage.checkpoint_storage().location).resolve()}
    return {"storage_origin": storage.download_url("origin", filename="origin")}


def kubernetes_pool_settings():
    """Return the Kubernetes launcher's ``PoolSettings`` from Lab's settings (``LAB_ENGINE_IMAGE``,
    ``LAB_MODEL_DIR``, ``LAB_K8S_MODEL_VOLUME``, ``LAB_POOL``'s GPU products, the stop and kill graces, ``LAB_K8S_NAMESPACE``,
    ``LAB_K8S_ENGINE_ROLES``, ``LAB_K8S_SHARED_PVC``, ``LAB_K8S_ORCHESTRATOR_CPU``/``_MEMORY_GIB``,
    ``LAB_K8S_ENGINE_EGRESS``, ``LAB_ENGINE_EGRESS_ALLOW_PRIVATE``)."""
    from jobs.launchers.kubernetes.objects import PoolSettings, gpu_products

    return PoolSettings(
        engine_image=settings.LAB_ENGINE_IMAGE,
        model_dir=str(settings.LAB_MODEL_DIR),
        model_volume=settings.LAB_K8S_MODEL_VOLUME,
        gpu_products=gpu_products(settings.LAB_POOL),
        stop_grace_s=settings.LAB_STOP_GRACE_S + settings.LAB_KILL_GRACE_S,
        shared_namespace=settings.LAB_K8S_NAMESPACE,
        engine_roles=settings.LAB_K8S_ENGINE_ROLES,
        shared_pvc=settings.LAB_K8S_SHARED_PVC,
        orchestrator_cpu=settings.LAB_K8S_ORCHESTRATOR_CPU,
        orchestrator_memory_gib=settings.LAB_K8S_ORCHESTRATOR_MEMORY_GIB,
        engine_egress=tuple(settings.LAB_K8S_ENGINE_EGRESS),
        allow_private_egress=settings.LAB_ENGINE_EGRESS_ALLOW_PRIVATE,
    )


def get_launcher() -> Launcher:
    """Return the configured launcher."""
    if settings.LAB_LAUNCHER == "local":
        return _local_launcher()
    return _launcher(settings.LAB_LAUNCHER)


def kubernetes_builds() -> KubernetesBuilds:
    """Return where environment builds run on the Kubernetes pool: batch Jobs through the
    launcher's gateway, in the engine image (``LAB_ENGINE_IMAGE``), sized and placed by
    ``LAB_K8S_BUILD_CPU``, ``LAB_K8S_BUILD_MEMORY_GIB`` and ``LAB_K8S_BUILD_NAMESPACE``, reaching
    what engine pods reach (``LAB_K8S_ENGINE_EGRESS``), public addresses and ``LAB_K8S_BUILD_EGRESS``."""
    return KubernetesBuilds(gateway=get_launcher().gateway, settings=BuildSettings(
        image=settings.LAB_ENGINE_IMAGE, namespace=setting("LAB_K8S_BUILD_NAMESPACE"), cpu=setting("LAB_K8S_BUILD_CPU"),
        memory_gib=setting("LAB_K8S_BUILD_MEMORY_GIB"), report_grace_s=REPORT_GRACE_S,
        egress=(*settings.LAB_K8S_ENGINE_EGRESS, *setting("LAB_K8S_BUILD_EGRESS")),
    ))


# environments never imports jobs: on the Kubernetes pool its builds run as Jobs through the
# launcher's gateway. Every process that runs builds imports this module (jobs.tasks, jobs.services).
build_clusters.register("kubernetes", kubernetes_builds)
