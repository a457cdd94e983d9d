# The engine on GPU nodes: vLLM with the CUDA torch its release pins (requirements-gpu.txt),
# then the rest of requirements.txt without its CPU torch and transformers lines. The CUDA
# runtime comes in torch's wheels; the node's NVIDIA driver and container toolkit do the rest.
# Build from the repository root: docker build -f k8s/images/engine-gpu.Dockerfile -t lab-engine-gpu .
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
    HF_HUB_OFFLINE=1 LAB_ENGINE_ROLLOUT=vllm
WORKDIR /app
COPY requirements.txt requirements-gpu.txt ./
RUN pip install -r requirements-gpu.txt \
    && grep -v -E '^(torch|transformers)==' requirements.txt > /tmp/requirements-rest.txt \
    && pip install -r /tmp/requirements-rest.txt
COPY sdk/ sdk/
RUN pip install --no-deps ./sdk/lab-environments ./sdk
# verifiers tasksets run in their own environment (docs/environments.md: its pins clash with
# vLLM's), every package pinned and installed without resolving, then checked.
COPY requirements-verifiers.txt ./
RUN python -m venv /opt/verifiers \
    && /opt/verifiers/bin/pip install --no-deps -r requirements-verifiers.txt \
    && /opt/verifiers/bin/pip check
ENV LAB_ENGINE_VERIFIERS_PYTHON=/opt/verifiers/bin/python
COPY engine/ engine/
# An environment build on the pool runs here (python -m environments.builder.pod, a Job per build):
# the builder and the few modules it imports, none of Lab's settings.
COPY environments/__init__.py environments/wheels.py environments/
COPY environments/builder/ environments/builder/
COPY lab/__init__.py lab/celery.py lab/
COPY lab/lib/__init__.py lab/lib/seccomp.py lab/lib/
RUN useradd --uid 1000 --create-home lab
USER 1000
CMD ["python", "-m", "engine", "--help"]
