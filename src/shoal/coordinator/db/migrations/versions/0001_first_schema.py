"""The coordinator's first schema: participants, agents, offers, jobs, leases, journal, audit log.

Revision ID: 0001
Revises: 
"""

import sqlalchemy as sa
from alembic import op


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('events',
    sa.Column('seq', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('at_s', sa.Float(), nullable=False),
    sa.Column('actor', sa.String(length=42), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('job_id', sa.String(length=64), nullable=True),
    sa.Column('detail', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('seq')
    )
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.create_index('ix_events_job_seq', ['job_id', 'seq'], unique=False)

    op.create_table('market_commands',
    sa.Column('seq', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('at_s', sa.Float(), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('payload', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('seq')
    )
    op.create_table('nonces',
    sa.Column('address', sa.String(length=42), nullable=False),
    sa.Column('nonce', sa.String(length=64), nullable=False),
    sa.Column('seen_at_s', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('address', 'nonce')
    )
    with op.batch_alter_table('nonces', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_nonces_seen_at_s'), ['seen_at_s'], unique=False)

    op.create_table('participants',
    sa.Column('address', sa.String(length=42), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('registered_at_s', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('address')
    )
    op.create_table('agents',
    sa.Column('agent_id', sa.String(length=64), nullable=False),
    sa.Column('provider', sa.String(length=42), nullable=False),
    sa.Column('region', sa.String(length=128), nullable=False),
    sa.Column('devices', sa.JSON(), nullable=False),
    sa.Column('registered_at_s', sa.Float(), nullable=False),
    sa.Column('last_seen_s', sa.Float(), nullable=False),
    sa.Column('running', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['provider'], ['participants.address'], ),
    sa.PrimaryKeyConstraint('agent_id')
    )
    with op.batch_alter_table('agents', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_agents_provider'), ['provider'], unique=False)

    op.create_table('jobs',
    sa.Column('job_id', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('submitter', sa.String(length=42), nullable=False),
    sa.Column('job_file', sa.Text(), nullable=False),
    sa.Column('bid', sa.JSON(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('created_at_s', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['submitter'], ['participants.address'], ),
    sa.PrimaryKeyConstraint('job_id')
    )
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_jobs_status'), ['status'], unique=False)
        batch_op.create_index(batch_op.f('ix_jobs_submitter'), ['submitter'], unique=False)

    op.create_table('offers',
    sa.Column('offer_id', sa.String(length=64), nullable=False),
    sa.Column('provider', sa.String(length=42), nullable=False),
    sa.Column('agent_id', sa.String(length=64), nullable=False),
    sa.Column('device', sa.Integer(), nullable=False),
    sa.Column('device_kind', sa.String(length=128), nullable=False),
    sa.Column('region', sa.String(length=128), nullable=False),
    sa.Column('speed_samples_per_s', sa.Float(), nullable=False),
    sa.Column('memory_gb', sa.Float(), nullable=False),
    sa.Column('price_wei_per_s', sa.String(length=80), nullable=False),
    sa.Column('tenancy', sa.String(length=16), nullable=False),
    sa.Column('reference_wei_per_s', sa.String(length=80), nullable=True),
    sa.Column('withdrawn', sa.Boolean(), nullable=False),
    sa.Column('marked_down', sa.Boolean(), nullable=False),
    sa.ForeignKeyConstraint(['agent_id'], ['agents.agent_id'], ),
    sa.ForeignKeyConstraint(['provider'], ['participants.address'], ),
    sa.PrimaryKeyConstraint('offer_id')
    )
    with op.batch_alter_table('offers', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_offers_agent_id'), ['agent_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_offers_provider'), ['provider'], unique=False)

    op.create_table('leases',
    sa.Column('lease', sa.Integer(), autoincrement=False, nullable=False),
    sa.Column('job_id', sa.String(length=64), nullable=False),
    sa.Column('offer_id', sa.String(length=64), nullable=False),
    sa.Column('provider', sa.String(length=42), nullable=False),
    sa.Column('price_wei_per_s', sa.String(length=80), nullable=False),
    sa.Column('start_s', sa.Float(), nullable=False),
    sa.Column('ends_at_s', sa.Float(), nullable=True),
    sa.Column('value', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.job_id'], ),
    sa.ForeignKeyConstraint(['offer_id'], ['offers.offer_id'], ),
    sa.PrimaryKeyConstraint('lease')
    )
    with op.batch_alter_table('leases', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_leases_job_id'), ['job_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_leases_offer_id'), ['offer_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_leases_provider'), ['provider'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('leases', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_leases_provider'))
        batch_op.drop_index(batch_op.f('ix_leases_offer_id'))
        batch_op.drop_index(batch_op.f('ix_leases_job_id'))

    op.drop_table('leases')
    with op.batch_alter_table('offers', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_offers_provider'))
        batch_op.drop_index(batch_op.f('ix_offers_agent_id'))

    op.drop_table('offers')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_jobs_submitter'))
        batch_op.drop_index(batch_op.f('ix_jobs_status'))

    op.drop_table('jobs')
    with op.batch_alter_table('agents', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_agents_provider'))

    op.drop_table('agents')
    op.drop_table('participants')
    with op.batch_alter_table('nonces', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_nonces_seen_at_s'))

    op.drop_table('nonces')
    op.drop_table('market_commands')
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.drop_index('ix_events_job_seq')

    op.drop_table('events')
