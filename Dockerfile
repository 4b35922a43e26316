# brats-seg on TensorFlow's CUDA image: the project installed non-editable, without the dev
# extra, constrained by requirements.lock, into a venv; run as an unprivileged user; every file a
# run writes (datasets it generates, the prepared cache, run folders, sweeps, the MLflow store,
# predicted masks) in a declared volume. Build and run lines, and the build measured:
# docs/installation.md, "Docker".
#
#   docker build -t brats-seg .
#   docker build -t brats-seg --build-arg UID=$(id -u) --build-arg GID=$(id -g) .   # own the files as you
#   docker build -t brats-seg:cpu --build-arg BASE_IMAGE=tensorflow/tensorflow:2.21.0 .  # CPU only, smaller
#   scripts/image/make_base.sh && podman build --build-arg BASE_IMAGE=localhost/brats-seg-base:bookworm -t brats-seg:cpu .
#       # no registry: Debian 12's Python, TensorFlow's wheel from PyPI (the build tests/integration/test_image.py runs)
#
# The default command is the BraTS challenges' container shape: segment every case folder in
# /input with the exported model mounted at /workspace/model, one /output/<case_id>.nii.gz each:
#
#   docker run --rm -v $PWD/outputs/demo/export:/workspace/model:ro -v $PWD/cases:/input:ro -v $PWD/masks:/output brats-seg
#
# Training, evaluation, export and the MLflow UI are explicit commands (`... brats-seg python
# train.py experiment=demo`, as in the README).
#
# The base image's TensorFlow must be the lock's (tests/unit/test_dockerfile.py checks the tag).
ARG BASE_IMAGE=tensorflow/tensorflow:2.21.0-gpu
FROM ${BASE_IMAGE}

# The project's environment: a venv over the base image's Python, first on PATH, so `python`,
# `pip`, `mlflow` are the venv's whatever the base calls its interpreter (Debian has no
# `python`). A venv because Debian 12 and Ubuntu 23.04+ refuse system-wide pip installs (PEP 668,
# "externally-managed-environment"). --system-site-packages: on TensorFlow's image the image's
# TensorFlow (built against its CUDA libraries) stays visible and the lock, which pins the same
# version, keeps it; on a bare Python base pip installs TensorFlow's wheel into the venv.
ENV PATH=/opt/venv/bin:$PATH
RUN python3 -m venv --system-site-packages /opt/venv

# Fail here, not at the first run, if the base image's Python is one the lock does not cover.
RUN python -c "import sys; v = sys.version_info[:2]; assert (3, 10) <= v < (3, 14), f'Python {v} is outside 3.10-3.13'; assert sys.prefix == '/opt/venv', sys.prefix" \
 && python -m pip --version

# 1. The dependencies, pinned by the lock. Only the project's metadata and an empty package are
#    copied, so this layer is rebuilt when pyproject.toml or the lock change, not for every code
#    edit. The lock pins TensorFlow to the base image's version, so pip keeps the image's build.
COPY pyproject.toml README.md requirements.lock /tmp/brats-seg/
RUN mkdir /tmp/brats-seg/brats_seg && touch /tmp/brats-seg/brats_seg/__init__.py \
 && python -m pip install --no-cache-dir --constraint /tmp/brats-seg/requirements.lock /tmp/brats-seg

# 2. The package itself, non-editable (into the venv's site-packages, package data included), then
#    a consistency check of the whole environment and the import that every entry point does.
COPY brats_seg /tmp/brats-seg/brats_seg
RUN python -m pip install --no-cache-dir --no-deps --force-reinstall --constraint /tmp/brats-seg/requirements.lock /tmp/brats-seg \
 && python -m pip check \
 && rm -rf /tmp/brats-seg \
 && python -c "import brats_seg, keras, mlflow, tensorflow as tf; print('tensorflow', tf.__version__, 'keras', keras.__version__, 'mlflow', mlflow.__version__)"

# The user the container runs as. Files in a volume belong to it; match the host's with the
# build args above, or at run time with --user "$(id -u):$(id -g)" and bind-mounted folders.
# Declared here, after the installs: a build arg's value is in every later RUN's environment, so
# a UID of one's own rebuilds from this step on, not the dependencies (minutes).
ARG UID=1000
ARG GID=1000
RUN groupadd --non-unique --gid "${GID}" brats \
 && useradd --non-unique --uid "${UID}" --gid "${GID}" --create-home --shell /bin/bash brats

# The entry points and the configs they compose, laid out as in the repository so that the
# README's commands work as typed (`python train.py ...`, `python scripts/evaluate.py ...`).
# Hydra finds configs/ beside train.py (and ../configs beside scripts/); there is no
# brats_seg/ folder here, so every import comes from the installed package. Owned by root:
# the user cannot change the code it runs.
WORKDIR /workspace
COPY train.py ./
COPY configs ./configs
COPY scripts ./scripts
COPY data/README.md ./data/README.md

# Where the project's relative defaults land (the cwd is /workspace):
#   data/synthetic, data/mni_gliomas   generated datasets          -> volume /workspace/data
#   data/cache  (data.cache_dir)       the prepared cache          -> volume /workspace/data/cache
#   outputs/... (hydra.run.dir, run_dir=outputs/<name>)           -> volume /workspace/outputs
#   multirun/... (hydra.sweep.dir, -m)                            -> volume /workspace/multirun
#   sqlite:///mlruns.db (tracking.uri): an installed copy takes a relative sqlite path from the
#     cwd, so /workspace/mlruns.db is a link into the MLflow volume; the artifacts go beside
#     the database it resolves to (/workspace/mlflow/mlartifacts).
# And the default command's (the challenge container's) folders:
#   /workspace/model   the exported model predict.py reads (export=): mount a folder
#                      `python scripts/export.py run_dir=outputs/<run>` wrote (outputs/<run>/export),
#                      read-only is fine, or COPY one in from a derived image
#   /input             the cases to segment, a BraTS case folder each (read-only is fine)
#   /output            the masks, <case_id>.nii.gz, and predict.json (what predicted them)
# Mount your datasets under /workspace/data (read-only is fine: -v /srv/BraTS2021:/workspace/data/BraTS2021:ro)
# and pass data.root=/workspace/data/BraTS2021.
RUN mkdir -p data/cache outputs multirun mlflow model /input /output \
 && ln -s /workspace/mlflow/mlruns.db mlruns.db \
 && chown "${UID}:${GID}" data data/cache outputs multirun mlflow model /input /output

# The same store for anything that reads MLflow's own variables: `mlflow ui`/`mlflow server`
# (backend store, served artifacts), the MLflow client, and tracking.uri= left empty.
ENV MLFLOW_TRACKING_URI=sqlite:////workspace/mlflow/mlruns.db \
    MLFLOW_BACKEND_STORE_URI=sqlite:////workspace/mlflow/mlruns.db \
    MLFLOW_ARTIFACTS_DESTINATION=/workspace/mlflow/mlartifacts \
    TF_CPP_MIN_LOG_LEVEL=2

VOLUME ["/workspace/data", "/workspace/data/cache", "/workspace/outputs", "/workspace/multirun", "/workspace/mlflow", "/workspace/model", "/input", "/output"]

# `mlflow ui --host 0.0.0.0 --port 5000` (publish with -p 127.0.0.1:5000:5000).
EXPOSE 5000

# No HEALTHCHECK: the default command is a prediction job that ends, not a service; for the
# MLflow UI, `docker run --health-cmd` can poll http://127.0.0.1:5000/health.

USER ${UID}:${GID}

# The BraTS challenges' container shape: every case folder in /input segmented by the model in
# /workspace/model, /output/<case_id>.nii.gz each (the grid and affine of the case's images, the
# run's layout labels), no overlay pictures. For other keys of scripts/predict.py give the whole
# command: `docker run ... brats-seg python scripts/predict.py export=/workspace/model
# input=/input output=/output labels=brats2023`.
CMD ["python", "scripts/predict.py", "export=/workspace/model", "input=/input", "output=/output", "evaluate.overlays=false"]
