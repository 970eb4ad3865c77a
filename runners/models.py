"""The Runner: a process that dialled in, identified by its binding token's derived id."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone


class Runner(models.Model):
    id = models.CharField(primary_key=True, max_length=64, editable=False)
    name = models.CharField(max_length=128, blank=True, default="")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="runners"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)
    # Set while a tunnel is connected: the consumer's channel and its connection generation.
    channel_name = models.CharField(max_length=256, blank=True, default="")
    generation = models.PositiveBigIntegerField(default=0)
    # The server process holding the tunnel (``runners.liveness.PROCESS_ID``): when it
    # stops or dies, its tunnels are marked offline.
    tunnel_process = models.CharField(max_length=64, blank=True, default="", db_index=True)
    connected_at = models.DateTimeField(null=True, blank=True)
    disconnected_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    runner_version = models.CharField(max_length=64, blank=True, default="")
    workspace = models.JSONField(default=dict, blank=True)
    # Turns the runner runs at once, from its latest ``hello`` (usage.md, Fair share):
    # the scheduler starts no more on it.
    max_turns = models.PositiveIntegerField(default=8)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["owner", "created_at"], name="runner_owner_created")]

    def __str__(self) -> str:
        return self.name or self.id

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    @property
    def online(self) -> bool:
        """A tunnel is connected (to any server process) and was heard from recently.

        ``channel_name`` is cleared when the tunnel closes, when its process stops, and
        when its process is found dead (``runners.liveness``); ``last_seen_at`` bounds
        the answer besides, so no row reads online forever.
        """
        if self.is_revoked or not self.channel_name or self.last_seen_at is None:
            return False
        stale_after = timedelta(seconds=3 * settings.OMNIGENT_HEARTBEAT_S + 5)
        return timezone.now() - self.last_seen_at <= stale_after
