"""The acts the audit log records (lifecycle.md, Audit log), by the ``action`` they carry."""

from __future__ import annotations

APPROVAL_VERDICT = "approval.verdict"
POLICY_CHANGE = "policy.change"
PERMISSION_GRANT = "permission.grant"
PERMISSION_REVOKE = "permission.revoke"
RUNNER_REGISTER = "runner.register"
RUNNER_REVOKE = "runner.revoke"
TOKEN_CREATE = "token.create"
TOKEN_REVOKE = "token.revoke"
SIGNIN = "signin"
SIGNIN_FAILED = "signin.failed"
BUDGET_CHANGE = "budget.change"
WEBHOOK_CHANGE = "webhook.change"
SESSION_EXPORT = "session.export"
SESSION_IMPORT = "session.import"
SESSION_DELETE = "session.delete"
AGENT_DELETE = "agent.delete"
FILE_DELETE = "file.delete"

ALL = (
    APPROVAL_VERDICT,
    POLICY_CHANGE,
    PERMISSION_GRANT,
    PERMISSION_REVOKE,
    RUNNER_REGISTER,
    RUNNER_REVOKE,
    TOKEN_CREATE,
    TOKEN_REVOKE,
    SIGNIN,
    SIGNIN_FAILED,
    BUDGET_CHANGE,
    WEBHOOK_CHANGE,
    SESSION_EXPORT,
    SESSION_IMPORT,
    SESSION_DELETE,
    AGENT_DELETE,
    FILE_DELETE,
)
