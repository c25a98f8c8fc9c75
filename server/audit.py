"""The audit log's public API, for hacfed-server's commands (registration, revocation, purge, verify).

    from hacfed.server.audit import AuditEvent, AuditLog, verify_audit_log
    AuditLog(state_dir / "audit.log").append(AuditEvent("register", participant="lab-c", detail="key 3fa2..."))

The implementation lives beside the journal that writes most lines (`hacfed.server.coordinator.audit`).
"""

from hacfed.server.coordinator.audit import AuditEvent, AuditLog, VerifyResult, verify_audit_log
from hacfed.server.coordinator.errors import AuditError

__all__ = ["AuditError", "AuditEvent", "AuditLog", "VerifyResult", "verify_audit_log"]
