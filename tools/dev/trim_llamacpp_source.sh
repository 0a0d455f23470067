#!/usr/bin/env bash
# Trim llama.cpp's source, as vendored by the PyPI sdist of llama-cpp-python 0.3.36, to what
# tools/dev/llamacpp_bench.py builds (llama-bench, llama-batched-bench; CPU and CUDA backends): ~2 MB as .tar.xz,
# small enough to travel to the device machine with the working tree.
#   tools/dev/trim_llamacpp_source.sh OUT.tar.xz     (downloads the sdist with pip)
set -euo pipefail
out=$(realpath -m "${1:?usage: $0 OUT.tar.xz}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download "llama-cpp-python==0.3.36" --no-deps --no-binary :all: -d "$work" -q
tar xzf "$work"/llama_cpp_python-0.3.36.tar.gz -C "$work"
src="$work/llama_cpp_python-0.3.36/vendor/llama.cpp"
cd "$src"
rm -rf docs models tests examples benches pocs app ci grammars skills requirements media gguf-py conversion \
       convert_*.py vendor/miniaudio .git
rm -rf ggml/src/ggml-{virtgpu,cann,openvino,webgpu,et,metal,hexagon,sycl,vulkan,opencl}
find tools -mindepth 1 -maxdepth 1 -type d ! -name batched-bench ! -name llama-bench -exec rm -rf {} +
printf '# trimmed for Ember (tools/dev/trim_llamacpp_source.sh): the two benches only\nfind_package(Threads REQUIRED)\nllama_add_compile_flags()\nadd_subdirectory(batched-bench)\nadd_subdirectory(llama-bench)\n' > tools/CMakeLists.txt
sed -i '/add_subdirectory(miniaudio)/d' vendor/CMakeLists.txt
tar cJf "$out" -C "$work/llama_cpp_python-0.3.36/vendor" llama.cpp
ls -la "$out"
