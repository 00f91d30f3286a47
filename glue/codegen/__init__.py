"""Kernel IR -> LLVM IR building blocks shared by the CPU and NVPTX targets."""
