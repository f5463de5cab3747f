"""vLLM in this process (:class:`VllmEngine`): one engine for every session, its CPU defaults
(lengths in tokens) and the dtype a CPU computes right in."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from models.llm import (
    ChatPrompts,
    GenerationStats,
    LlmError,
    Message,
    StatsBook,
    check_salt,
    elapsed_ms,
)

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

log = logging.getLogger(__name__)
Dtype = Literal["bfloat16", "float32", "auto"]  # what an in-process vLLM computes in

PROJECT_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class VllmOptions:
    """In-process vLLM settings (CPU defaults: small KV cache, eager mode, 32-token blocks)."""

    max_model_len: int = 2048  # tokens, prompt and reply together
    enforce_eager: bool = True  # no graph compilation (start in ~30 s on CPU)
    enable_prefix_caching: bool = True
    # tokens per KV block, the prefix cache's unit; vLLM 0.32's CPU attention takes only
    # multiples of 32 (16 fails at start: "No common block size for 16")
    block_size: int = 32
    kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE when unset
    dtype: Dtype = "bfloat16"
    temperature: float = 0.0  # 0 = greedy
    max_num_seqs: int = 16  # concurrent requests in one batch
    seed: int = 0
    omp_bind: str = ""  # cores of the OpenMP threads ("1", "2,3"); "" = vLLM's own choice


class VllmEngine:
    """vLLM's AsyncLLM in this process (the engine core runs in a spawned child process).

    Constructing it loads the model and blocks for ~20-40 s; in async code use :meth:`start`.
    Entry points that start it need an ``if __name__ == "__main__":`` guard (spawn).
    """

    def __init__(self, model_dir: Path, options: VllmOptions | None = None) -> None:
        self.model_dir = Path(model_dir)
        self.options = options or VllmOptions()
        self._stats = StatsBook()
        self._closed = False
        if not (self.model_dir / "config.json").is_file():
            raise LlmError(f"no model at {self.model_dir} (run python -m models.prepare)")
        _default_env(self.options)
        started = time.perf_counter()
        log.info("loading LLM from %s", self.model_dir)
        try:
            from transformers import AutoTokenizer
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.platforms import current_platform
            from vllm.v1.engine.async_llm import AsyncLLM

            self.prompts = ChatPrompts(AutoTokenizer.from_pretrained(str(self.model_dir)))
            dtype = self.options.dtype
            if current_platform.is_cpu():
                dtype = cpu_dtype(dtype)
            args = AsyncEngineArgs(
                model=str(self.model_dir),
                dtype=dtype,
                max_model_len=self.options.max_model_len,
                enforce_eager=self.options.enforce_eager,
                enable_prefix_caching=self.options.enable_prefix_caching,
                block_size=self.options.block_size,
                max_num_seqs=self.options.max_num_seqs,
                seed=self.options.seed,
                disable_log_stats=True,
            )
            self._engine: AsyncLLM = AsyncLLM.from_engine_args(args)
        except Exception as e:
            raise LlmError(f"could not start vLLM on {self.model_dir}: {e}") from e
        log.info("LLM ready in %.1f s", time.perf_counter() - started)

    @classmethod
    async def start(cls, model_dir: Path, options: VllmOptions | None = None) -> VllmEngine:
        """Load the model without blocking the event loop (~20-40 s on CPU)."""
        return await asyncio.to_thread(cls, model_dir, options)

    def render(self, messages: Sequence[Message]) -> list[int]:
        """Prompt token ids: the chat template with the assistant turn opened."""
        return self.prompts.render(messages)

    def stream(
        self,
        messages: Sequence[Message],
        request_id: str,
        max_tokens: int,
        *,
        cache_salt: str | None = None,
    ) -> AsyncGenerator[str, None]:
        """Greedy (by default) reply deltas; ``aclose()`` or cancelling the consumer aborts."""
        return self._generate(messages, request_id, max_tokens, cache_salt)

    async def prefill(
        self, messages: Sequence[Message], request_id: str, *, cache_salt: str | None = None
    ) -> GenerationStats:
        """Submit exactly the tokens stream() would (assistant turn opened, nothing after it).

        Every whole KV block of that prompt stays in the prefix cache, so a later stream() of
        the same or an extended conversation, with the same ``cache_salt``, reuses it. One
        token is generated and dropped.
        """
        generation = self._generate(messages, request_id, 1, cache_salt)
        return await self._stats.drain(generation, request_id)

    async def prefill_open(
        self,
        messages: Sequence[Message],
        request_id: str,
        *,
        cache_salt: str | None = None,
        paused: bool = False,
    ) -> GenerationStats:
        """Warm the prefix cache while the last message is still being said: the prompt of
        :meth:`ChatPrompts.render_open`, a token prefix of the one stream() will send once the
        message is complete, so that reply reuses its whole blocks. One token is generated.
        ``paused`` changes nothing: vLLM reuses whole blocks, so the turn stays open."""
        generation = self._generate(messages, request_id, 1, cache_salt, open_turn=True)
        return await self._stats.drain(generation, request_id)

    async def _generate(
        self,
        messages: Sequence[Message],
        request_id: str,
        max_tokens: int,
        cache_salt: str | None,
        open_turn: bool = False,
    ) -> AsyncGenerator[str, None]:
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        if self._closed:
            raise LlmError("the engine is closed")
        check_salt(cache_salt)
        started = time.perf_counter()
        ids = self.prompts.render_open(messages) if open_turn else self.render(messages)
        room = self.options.max_model_len - len(ids)
        if room < 1:
            raise LlmError(
                f"prompt of {len(ids)} tokens leaves no room (max_model_len "
                f"{self.options.max_model_len})"
            )
        params = SamplingParams(
            output_kind=RequestOutputKind.DELTA,
            max_tokens=max(1, min(max_tokens, room)),
            temperature=self.options.temperature,
        )
        cached = 0
        produced = 0
        ttft: float | None = None
        finish: str | None = None
        tokens = TokensPrompt(prompt_token_ids=ids)
        if cache_salt is not None:  # vLLM hashes it into the first block, so into every block
            tokens["cache_salt"] = cache_salt
        try:
            (prompt,) = self._engine.renderer.render_cmpl([tokens])
        except Exception as e:
            raise LlmError(f"vLLM rejected the prompt of {request_id}: {e}") from e
        outputs = self._engine.generate(prompt, params, request_id)
        try:
            async for out in outputs:
                if out.num_cached_tokens:  # reported on the first delta only; later ones say 0
                    cached = max(cached, out.num_cached_tokens)
                if not out.outputs:
                    continue
                done = out.outputs[0]
                if done.token_ids:
                    produced += len(done.token_ids)
                    if ttft is None:
                        ttft = elapsed_ms(started)
                if done.finish_reason is not None:
                    finish = done.finish_reason
                if done.text:
                    yield done.text
        except (GeneratorExit, asyncio.CancelledError):
            finish = finish or "abort"  # the consumer closed or cancelled the stream
            raise
        except Exception as e:
            raise LlmError(f"vLLM request {request_id} failed: {e}") from e
        finally:
            await outputs.aclose()  # aborts the request in vLLM if it is still running
            self._stats.put(request_id, GenerationStats(len(ids), cached, produced, ttft, finish))

    async def abort(self, request_id: str) -> None:
        if self._closed:
            return
        try:
            await self._engine.abort(request_id)
        except Exception as e:
            raise LlmError(f"aborting {request_id} failed: {e}") from e

    def last_stats(self, request_id: str) -> GenerationStats | None:
        return self._stats.get(request_id)

    def running(self) -> int:
        """Requests the engine has not finished (0 once every stream ended or was aborted)."""
        return 0 if self._closed else self._engine.get_num_unfinished_requests()

    async def close(self) -> None:
        """Stop the engine processes (~5 s); streams still running fail with LlmError."""
        if self._closed:
            return
        self._closed = True
        started = time.perf_counter()
        await asyncio.to_thread(self._engine.shutdown)
        del self._engine  # its __del__ shuts down again; let that happen now, not at exit
        log.info("LLM engine shut down in %.1f s", time.perf_counter() - started)


def cpu_dtype(requested: Dtype, cpu_flags: str | None = None) -> Dtype:
    """The dtype vLLM's CPU build runs: ``requested``, except bfloat16 on a CPU with AMX
    (``amx_bf16``: Intel Sapphire Rapids and later), where vLLM 0.32 computes wrong tokens
    (SmolLM2 answered "L'Étoile, la Marseillaise, ..." to "What is the capital of France?";
    in float32, "The capital of France is Paris."): float32 there."""
    flags = _cpu_flags() if cpu_flags is None else cpu_flags
    if requested == "bfloat16" and "amx_bf16" in flags.split():
        log.warning("this CPU has AMX, where vLLM's bfloat16 is wrong: running float32")
        return "float32"
    return requested


def _cpu_flags() -> str:
    """The ISA flags of the first CPU in /proc/cpuinfo ("" where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            for line in info:
                if line.startswith("flags"):
                    return line.partition(":")[2]
    except OSError:
        pass
    return ""


def _default_env(options: VllmOptions) -> None:
    """vLLM settings read from the environment, only where the operator has not set them."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(options.kv_cache_gib))  # GiB
    os.environ.setdefault("VLLM_CACHE_ROOT", str(PROJECT_ROOT / ".cache" / "vllm"))
    if options.omp_bind:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", options.omp_bind)
