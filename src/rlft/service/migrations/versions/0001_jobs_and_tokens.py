"""jobs and tokens

Revision ID: 0001
Revises:
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error_type", sa.String(32)),
        sa.Column("exit_code", sa.Integer),
        sa.Column("pid", sa.Integer),
        sa.Column("pid_started", sa.Float),
        sa.Column("worker", sa.String(64)),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("started_at", sa.Float),
        sa.Column("finished_at", sa.Float),
        sa.Column("config_source", sa.Text),
        sa.Column("config_yaml", sa.Text, nullable=False),
        sa.Column("job_dir", sa.Text, nullable=False),
        sa.Column("run_dir", sa.Text, nullable=False),
        sa.Column("stdout_log", sa.Text, nullable=False),
        sa.Column("stderr_log", sa.Text, nullable=False),
        sa.Column("resume_from", sa.Text),
        sa.Column("resumed_job", sa.String(32)),
        sa.Column("cancel_requested", sa.Boolean, nullable=False),
        sa.Column("summary", sa.Text),
        sa.Column("submitted_by", sa.String(64)),
    )
    op.create_index("ix_jobs_seq", "jobs", ["seq"])
    op.create_index("ix_jobs_status", "jobs", ["status"])
    op.create_table(
        "tokens",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("digest", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("tokens")
    op.drop_index("ix_jobs_status", "jobs")
    op.drop_index("ix_jobs_seq", "jobs")
    op.drop_table("jobs")
