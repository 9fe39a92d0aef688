"""sweeps: the columns ``rlft sweep`` records on each attempt of a run

Revision ID: 0002
Revises: 0001
Create Date: 2027-01-10

All nullable, so the service's own jobs (and every row written before) simply leave them empty.
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

COLUMNS = (
    ("sweep", sa.Text),  # the sweep the row belongs to (its directory); NULL for a service job
    ("name", sa.Text),  # the run's name within the sweep (one name, one row per attempt)
    ("attempt", sa.Integer),  # 1 for the first try, 2 for the first retry ...
    ("failure_class", sa.String(32)),  # rlft.sweep.failures.FAILURE_CLASSES, NULL for a success
    ("metrics_final", sa.Text),  # JSON {metric: value at the last step}
    ("metrics_best", sa.Text),  # JSON {metric: best value over the run}
    ("retry_of", sa.String(32)),  # the job id of the attempt this one retries or continues
)


def upgrade() -> None:
    for name, type_ in COLUMNS:
        op.add_column("jobs", sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:  # SQLite drops columns by copying the table
        for name, _ in reversed(COLUMNS):
            batch.drop_column(name)
