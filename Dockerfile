# GPU image: TensorFlow's CUDA base, the project installed the way the README does.
#   docker build -t brats-seg .
#   docker run --gpus all -v /data:/data brats-seg python train.py data=brats2021 data.root=/data/BraTS2021 backend=gpu_lms resolution=full
FROM tensorflow/tensorflow:2.21.0-gpu

WORKDIR /opt/brats-seg
COPY pyproject.toml README.md Makefile ./
COPY brats_seg ./brats_seg
COPY configs ./configs
COPY scripts ./scripts
COPY train.py ./
COPY data/README.md ./data/README.md

# The base image already has TensorFlow with CUDA; install the project (and its pinned
# dependencies) into the image's Python, as `make install` does into .venv.
RUN python -m pip install --no-cache-dir --upgrade pip \
 && python -m pip install --no-cache-dir -e ".[dev]"

ENV TF_CPP_MIN_LOG_LEVEL=2
CMD ["python", "train.py", "backend=gpu"]
