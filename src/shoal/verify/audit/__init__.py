"""Audits of one work record: re-executing the step it states and comparing what the
worker committed, for every-step and DiLoCo jobs, recorded or not."""
