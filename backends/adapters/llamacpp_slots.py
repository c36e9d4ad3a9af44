"""Prompt caches kept across Switchyard's swaps on a llama-server router started with
`--slot-save-path`: before a model is unloaded, each slot that holds a prompt is saved to a
file on the server (`POST /slots/{id}?action=save`); once the model is loaded again, those
slots are restored (`action=restore`). A long system prompt (an agent's, Claude Code's)
is then not processed again after every swap.

Best effort, never in the way: a save or restore that fails is logged and the unload or
load goes on. A server started without `--slot-save-path` answers 501; it is asked once,
then left alone. The files stay on the server's disk, one per model and slot, each
overwritten by that slot's next save; every slot of a model saved once is restored at each
of its loads (a restored cache nobody used, evicted again, is not lost). Which slots have a
file is kept in memory, so a worker that restarts (or another worker that takes the server
over) restores nothing until it has saved them itself.
"""

import hashlib
import logging
import re
from typing import TYPE_CHECKING, Any

from .base import AdapterError

if TYPE_CHECKING:
    from .http import HttpAdapter

log = logging.getLogger(__name__)


def file_name(model_id: str, slot: int) -> str:
    """A name llama-server takes (letters, digits, `.`, `_`, `-`) that no other model's
    shares: the readable part, then a hash of the exact id."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", model_id).strip("._")[:60]
    digest = hashlib.sha256(model_id.encode()).hexdigest()[:10]
    return f"switchyard-{readable}-{digest}-slot{slot}.bin"


def holds_prompt(slot: dict[str, Any]) -> bool:
    tokens = slot.get("n_prompt_tokens")
    return isinstance(slot.get("id"), int) and isinstance(tokens, int) and tokens > 0


class PromptCaches:
    def __init__(self) -> None:
        self.supported: bool | None = None  # None until the server has answered a save
        self.saved: dict[str, set[int]] = {}  # model id → its slots with a saved file

    async def save(self, adapter: "HttpAdapter", model_id: str) -> None:
        """Save the slots of `model_id` (loaded, idle: about to be unloaded) that hold a
        prompt."""
        if self.supported is False:
            return
        try:
            slots = await adapter.json("GET", "/slots", params={"model": model_id})
        except AdapterError as error:
            if error.status == 501:  # started with --no-slots
                self.unsupported(adapter)
            else:
                log.warning("could not list the slots of %s to save them: %s", model_id, error)
            return
        saved = []
        for slot in slots if isinstance(slots, list) else []:
            if not holds_prompt(slot):
                continue
            try:
                await self.slot_action(adapter, model_id, slot["id"], "save")
            except AdapterError as error:
                if error.status == 501:  # started without --slot-save-path
                    self.unsupported(adapter)
                    return
                log.warning("could not save slot %s of %s: %s", slot["id"], model_id, error)
                continue
            self.supported = True
            saved.append(slot["id"])
        self.saved.setdefault(model_id, set()).update(saved)
        if saved:
            log.info("saved the prompt caches of %s (slots %s) before its unload", model_id, saved)

    def unsupported(self, adapter: "HttpAdapter") -> None:
        self.supported = False
        log.info(
            "%s cannot save slots (no --slot-save-path, or --no-slots): prompt caches are"
            " not kept across swaps there",
            adapter.base_url,
        )

    async def restore(self, adapter: "HttpAdapter", model_id: str) -> None:
        """Restore the slots of `model_id` saved at its unloads into the model just loaded."""
        restored = []
        for slot in sorted(self.saved.get(model_id, ())):
            try:
                await self.slot_action(adapter, model_id, slot, "restore")
            except AdapterError as error:
                log.warning("could not restore slot %s of %s: %s", slot, model_id, error)
                continue
            restored.append(slot)
        if restored:
            log.info("restored the prompt caches of %s (slots %s)", model_id, restored)

    @staticmethod
    async def slot_action(adapter: "HttpAdapter", model_id: str, slot: int, action: str) -> None:
        await adapter.json(
            "POST",
            f"/slots/{slot}",
            params={"action": action},
            json={"filename": file_name(model_id, slot), "model": model_id},
        )
