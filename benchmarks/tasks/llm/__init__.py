"""Everything that asks an LLM: the OpenAI-compatible client with its one on-disk cache (``client``)
and the judge's prompts with their parsers (``prompts``). The judges themselves are in
``benchmarks.tasks.judge``."""
