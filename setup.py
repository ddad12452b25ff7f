"""Builds the hotswitch Python package and its native extension hotswitch._C.

    /usr/bin/python3 setup.py build_ext --inplace   # what script/test does
    pip install .                                   # elsewhere

The CUDA-native NCCL transport is built by CMake (HOTSWITCH_WITH_NCCL); the extension
reaches NCCL through torch.distributed's process groups.
"""

import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
CORE = [
    "csrc/common/Logging.cpp",
    "csrc/layout/Box.cpp",
    "csrc/layout/Topology.cpp",
    "csrc/layout/Layout.cpp",
    "csrc/layout/ParamSpec.cpp",
    "csrc/layout/Placement.cpp",
    "csrc/redistribute/MaxFlow.cpp",
    "csrc/redistribute/RedistributionPlan.cpp",
    "csrc/redistribute/PlanCache.cpp",
    "csrc/planner/ModelConfig.cpp",
    "csrc/planner/HardwareProfile.cpp",
    "csrc/planner/CostModel.cpp",
    "csrc/planner/Packer.cpp",
    "csrc/planner/Planner.cpp",
    "csrc/planner/SwitchEstimate.cpp",
    "csrc/redistribute/SwitchExecutor.cpp",
    "csrc/transport/C10dTransport.cpp",
    "csrc/bindings/init.cpp",
]

setup(
    name="hotswitch",
    version="0.1.0",
    description="Per-step parallel layouts with planned hot switching for LLM training",
    package_dir={"": "python"},
    packages=["hotswitch", "hotswitch.model"],
    ext_modules=[
        CppExtension(
            "hotswitch._C",
            sources=CORE,
            include_dirs=[os.path.join(ROOT, "csrc")],
            extra_compile_args=["-O2", "-std=c++17"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
