"""The local backend: a transformers model in this process, answering requests in batches.

The conversation walk is the same as for servers: each row's task awaits `chat`; requests that
arrive together are padded into one `generate` call on a worker thread (up to `concurrency` rows).
Answers come back shaped like a chat completion, so they go through the same parsing and checks.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from draftdeck.errors import UsageError
from draftdeck.provenance import ModelIdentity, vocab_fingerprint
from draftdeck.regenerate.answer import THINK_CLOSE, THINK_OPEN, Answer, RowRejected, parse_completion
from draftdeck.regenerate.images import pictures_of, reads_images
from draftdeck.regenerate.params import RegenerateParams

_Request = tuple[list[dict[str, Any]], list[dict[str, Any]], "asyncio.Future[Answer]"]


class LocalBackend:
    def __init__(self, params: RegenerateParams):
        import torch
        from transformers import AutoTokenizer

        from draftdeck.causal_lm import load_causal_lm

        folder = Path(params.local or "")
        if not (folder / "config.json").exists():
            raise UsageError(f"--local {folder}: not a model folder (no config.json)")
        self.params = params
        self.name = f"local:{folder}"
        self.identity = ModelIdentity.of_folder(folder)  # recorded in every row it answers
        self.vocab = vocab_fingerprint(folder)  # the vocabulary of the token ids it records
        self.tok = AutoTokenizer.from_pretrained(str(folder))
        self.tok.padding_side = "left"
        self.model: Any
        # A vision-language target is loaded whole, its image processor beside it (PIL backend, as
        # tokenize's: torchvision's wheels do not load beside the CPU torch here), so the rows' images
        # reach its vision tower; a text target's rows with images were refused by the reader.
        self.vision: Any = None
        if reads_images(folder):
            from transformers import AutoImageProcessor, AutoModelForImageTextToText

            self.model = AutoModelForImageTextToText.from_pretrained(folder, local_files_only=True).eval()
            self.vision = AutoImageProcessor.from_pretrained(
                str(folder), backend="pil", local_files_only=True
            )
            self.image_id = int(self.model.config.image_token_id)
            self.image_token = str(self.tok.convert_ids_to_tokens(self.image_id))
            self.merge = int(getattr(self.vision, "merge_size", 1) or 1)
        else:
            self.model, _ = load_causal_lm(folder)  # a checkpoint with a vision tower: its language model
        self.model = self.model.to(params.device)
        self.torch = torch
        gen = self.model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else self.tok.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos])
        self.special = set(self.tok.all_special_ids)
        text_config = self.model.config.get_text_config()
        self.context = int(getattr(text_config, "max_position_embeddings", 0) or 0)
        self._queue: asyncio.Queue[_Request] | None = None
        self._worker: asyncio.Task[None] | None = None
        self.requests = self.ok = self.errors = 0

    async def preflight(self) -> None:
        self._queue = asyncio.Queue()
        self._worker = asyncio.create_task(self._serve())

    async def aclose(self) -> None:
        if self._worker is not None:
            self._worker.cancel()

    async def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Answer:
        assert self._queue is not None, "preflight() starts the batching worker"
        fut: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self.requests += 1
        await self._queue.put((messages, tools, fut))
        return await fut

    async def _serve(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            await asyncio.sleep(0.002)  # let the other rows' requests of this step arrive
            while len(batch) < self.params.concurrency and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                results = await loop.run_in_executor(None, self._generate, batch)
            except Exception as exc:  # a failure of the whole batch: every row in it is told
                for *_, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            for (*_, fut), res in zip(batch, results, strict=True):
                if fut.done():
                    continue
                if isinstance(res, RowRejected):
                    self.errors += 1
                    fut.set_exception(res)
                else:
                    self.ok += 1
                    fut.set_result(res)

    def _prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        return str(
            self.tok.apply_chat_template(
                messages,
                tools=tools or None,  # type: ignore[arg-type]
                add_generation_prompt=True,
                tokenize=False,
                **self.params.template_kwargs(),
            )
        )

    def _with_pictures(self, text: str, messages: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
        """The prompt with each image token expanded to its picture's count (the processor's grid),
        as a VLM server's processor does, and the pixel values and grids of its pictures in order."""
        pictures = pictures_of(messages)
        if not pictures:
            return text, {}
        found = text.count(self.image_token)
        if found != len(pictures):
            raise RowRejected(
                "template_error",
                f"{self.name}: the chat template rendered {found} image tokens for {len(pictures)} images",
            )
        inputs = self.vision(pictures, return_tensors="pt")
        grids = inputs["image_grid_thw"]
        for grid in grids.tolist():  # one placeholder at a time, in order: each its own picture's count
            count = grid[0] * grid[1] * grid[2] // (self.merge * self.merge)
            text = text.replace(self.image_token, "\0" * count, 1)
        return text.replace("\0", self.image_token), {
            "pixel_values": inputs["pixel_values"], "image_grid_thw": grids,
        }  # fmt: skip

    def _generate(self, batch: list[_Request]) -> list[Answer | RowRejected]:
        p = self.params
        results: list[Answer | RowRejected | None] = [None] * len(batch)
        prompts, idx, seen = [], [], []
        for i, (messages, tools, _) in enumerate(batch):
            try:
                text = self._prompt(messages, tools)
            except Exception as exc:  # the template raised on this conversation
                results[i] = RowRejected("malformed_answer", f"{self.name}: chat template raised: {exc}")
                continue
            pixels: dict[str, Any] = {}
            if self.vision is not None:
                try:
                    text, pixels = self._with_pictures(text, messages)
                except RowRejected as exc:
                    results[i] = exc
                    continue
            n = len(self.tok(text, add_special_tokens=False)["input_ids"])
            if self.context and n + 1 > self.context:
                results[i] = RowRejected(
                    "prompt_too_long", f"{self.name}: prompt of {n} tokens, context window {self.context}"
                )
                continue
            prompts.append(text)
            idx.append(i)
            seen.append(pixels)
        if prompts:
            torch = self.torch
            enc = self.tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(p.device)
            images = self._batch_pixels(seen, enc["input_ids"])
            if p.seed is not None:
                torch.manual_seed(p.seed)
            sample = p.temperature > 0
            with torch.inference_mode():
                out = self.model.generate(
                    **enc,
                    max_new_tokens=p.max_tokens,
                    do_sample=sample,
                    temperature=p.temperature if sample else None,
                    top_p=p.top_p if sample else None,
                    top_k=None,
                    pad_token_id=self.tok.pad_token_id,
                    **images,
                )
            width = enc["input_ids"].shape[1]
            for row, i in enumerate(idx):
                results[i] = self._answer(
                    prompts[row], out[row, width:].tolist(), int(enc["attention_mask"][row].sum())
                )
        return [r for r in results if r is not None]

    def _batch_pixels(self, seen: list[dict[str, Any]], input_ids: Any) -> dict[str, Any]:
        """A batch's image inputs: every prompt's pixels and grids in row order, and the token types
        (1 at image tokens) the model places its vision features by; {} for a batch without images."""
        with_images = [s for s in seen if s]
        if not with_images:
            return {}
        torch, device = self.torch, self.params.device
        return {
            "pixel_values": torch.cat([s["pixel_values"] for s in with_images]).to(device),
            "image_grid_thw": torch.cat([s["image_grid_thw"] for s in with_images]).to(device),
            "mm_token_type_ids": (input_ids == self.image_id).int(),
        }

    def _answer(self, prompt: str, ids: list[int], prompt_tokens: int) -> Answer:
        stop = next((k for k, t in enumerate(ids) if t in self.eos), None)
        n_generated = len(ids) if stop is None else stop + 1
        finish = "length" if stop is None else "stop"
        generated = ids[:n_generated]  # what the model wrote, its stop token included
        if stop is not None:
            # A stop token that is ordinary text (a generation config may list some) is part of the
            # answer, as servers return it; special ones (<|im_end|>) are not.
            ids = ids[: stop + (ids[stop] not in self.special)]
        text = str(self.tok.decode(ids, skip_special_tokens=False))
        # The template may open the think block in the generation prompt: the answer starts inside it.
        opened = prompt.rstrip().endswith(THINK_OPEN)
        # Surrounding whitespace is stripped, as Qwen3 response parsers of servers do.
        message: dict[str, Any] = {"role": "assistant", "content": text.strip()}
        if opened:
            end = text.find(THINK_CLOSE)
            reasoning = text if end < 0 else text[:end]
            message = {
                "role": "assistant",
                "content": "" if end < 0 else text[end + len(THINK_CLOSE) :].strip(),
                "reasoning_content": reasoning.strip(),
            }
        body = {
            "choices": [{"message": message, "finish_reason": finish, "token_ids": generated}],
            "usage": {"completion_tokens": n_generated, "prompt_tokens": prompt_tokens},
        }
        return parse_completion(body, self.name)

    def health(self) -> list[dict[str, Any]]:
        return [{"url": self.name, "requests": self.requests, "ok": self.ok, "errors": self.errors}]
