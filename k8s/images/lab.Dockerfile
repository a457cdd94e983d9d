# Lab's image: web (uvicorn), Celery worker and beat, and the migration Job (k8s/base).
# Build from the repository root: docker build -f k8s/images/lab.Dockerfile -t lab .
# Not built in CI (no container engine there): tests/k8s/test_images.py checks what it copies.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY requirements.txt ./
# torch is the CPU wheel: Lab's own processes never touch a GPU.
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu -r requirements.txt
COPY sdk/ sdk/
RUN pip install --no-deps ./sdk/lab-environments ./sdk
COPY manage.py ./
COPY lab/ lab/
COPY jobs/ jobs/
COPY billing/ billing/
COPY environments/ environments/
COPY dashboard/ dashboard/
COPY engine/ engine/
COPY templates/ templates/
COPY static/ static/
RUN useradd --uid 1000 --create-home lab && mkdir -p /var/lab && chown lab /var/lab
USER 1000
ENV LAB_DATA_DIR=/var/lab
EXPOSE 8000
CMD ["python", "-m", "uvicorn", "lab.asgi:application", "--host", "0.0.0.0", "--port", "8000"]
