"""Database triggers that keep audit records append-only whatever the caller.

PostgreSQL: ``UPDATE`` is refused; ``DELETE`` only of rows older than the cutoff of a
purge permit (``AuditPurgePermit``) that the retention writes in its own transaction.
SQLite: ``UPDATE`` is refused (a ``DELETE`` trigger would also stop the test runner's
flush, which deletes every row; the model and its manager refuse deletes there).
"""

from django.db import migrations

PG_CREATE = """
CREATE OR REPLACE FUNCTION audit_record_guard() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' AND EXISTS (
        SELECT 1 FROM audit_auditpurgepermit WHERE OLD.at < cutoff
    ) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit records are append-only (% refused)', TG_OP;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER audit_record_guard BEFORE UPDATE OR DELETE ON audit_auditrecord
    FOR EACH ROW EXECUTE FUNCTION audit_record_guard();
"""
PG_DROP = """
DROP TRIGGER IF EXISTS audit_record_guard ON audit_auditrecord;
DROP FUNCTION IF EXISTS audit_record_guard();
"""
SQLITE_CREATE = """
CREATE TRIGGER audit_record_no_update BEFORE UPDATE ON audit_auditrecord
BEGIN
    SELECT RAISE(ABORT, 'audit records are append-only (UPDATE refused)');
END;
"""
SQLITE_DROP = "DROP TRIGGER IF EXISTS audit_record_no_update;"


def create(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(PG_CREATE, params=None)
    elif vendor == "sqlite":
        schema_editor.execute(SQLITE_CREATE)


def drop(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(PG_DROP, params=None)
    elif vendor == "sqlite":
        schema_editor.execute(SQLITE_DROP)


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_initial")]

    operations = [migrations.RunPython(create, drop)]
