"""The real SGLang server on a CPU: its environment (`bench/setup_sglang_reference.sh`) and its
launcher (`bench.sglang_cpu.launcher`)."""
