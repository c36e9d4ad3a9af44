"""Websockets for staff: every message carries the full state, sent after commit."""

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from scheduler.announce import DASHBOARD_GROUP, request_group

from . import state


class StaffConsumer(AsyncJsonWebsocketConsumer):
    groups_to_join: list[str] = []

    async def connect(self) -> None:
        user = self.scope.get("user")
        if not (user and user.is_authenticated and user.is_staff):
            await self.close(code=4403)
            return
        for group in self.group_names():
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        await self.push()

    async def disconnect(self, code) -> None:
        for group in self.group_names():
            await self.channel_layer.group_discard(group, self.channel_name)

    def group_names(self) -> list[str]:
        raise NotImplementedError

    async def push(self) -> None:
        raise NotImplementedError


class DashboardConsumer(StaffConsumer):
    def group_names(self) -> list[str]:
        return [DASHBOARD_GROUP]

    async def push(self) -> None:
        await self.send_json(
            {"type": "overview", "state": await database_sync_to_async(state.overview)()}
        )

    async def dashboard_changed(self, message) -> None:
        await self.push()


class RequestConsumer(StaffConsumer):
    def group_names(self) -> list[str]:
        return [request_group(self.scope["url_route"]["kwargs"]["request_id"]), DASHBOARD_GROUP]

    async def push(self) -> None:
        detail = await database_sync_to_async(state.request_detail)(
            self.scope["url_route"]["kwargs"]["request_id"]
        )
        await self.send_json({"type": "request", "state": detail})

    async def request_moved(self, message) -> None:
        await self.push()

    async def dashboard_changed(self, message) -> None:
        await self.push()

    async def stream_chunk(self, message) -> None:
        """Tokens are for the caller, not the dashboard."""
