"""The tuned database's tables (SQLAlchemy 2.x): GPUs, kernel configurations, problems,
trials, and the GPUs' measured ceilings.

A problem is keyed on everything that changes the answer: GPU, arch, CUDA version, the
generator hash of the kernel family that tuned it (``template_hash``), pattern, vector
length, dtype, A layout and shape. A configuration is keyed on its name and the hash of
its source (``source_hash``), so a kernel whose code changed is a new row.
"""

from __future__ import annotations

import datetime

from sqlalchemy import (
    JSON,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


class TrialStatus:
    OK = "ok"
    WRONG = "wrong_result"
    COMPILE_ERROR = "compile_error"
    LAUNCH_ERROR = "launch_error"
    INFEASIBLE = "infeasible"
    MODEL = "model"  # a dry run's analytic estimate, never a measurement


GOOD = (TrialStatus.OK, TrialStatus.MODEL)  # statuses whose time is a result


class Base(DeclarativeBase):
    pass


class GpuRow(Base):
    __tablename__ = "nm_gpus"
    __table_args__ = (UniqueConstraint("name", "arch", "cuda_version"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64))  # table name, e.g. "h100"
    device_name: Mapped[str] = mapped_column(String(128))
    arch: Mapped[str] = mapped_column(String(16))
    cuda_version: Mapped[int] = mapped_column(Integer)
    sms: Mapped[int] = mapped_column(Integer)


class CeilingRow(Base):
    """A GPU's ceilings as ``nmgen bench`` measured them (FFMA loop, device copy)."""

    __tablename__ = "nm_ceilings"
    id: Mapped[int] = mapped_column(primary_key=True)
    gpu: Mapped[str] = mapped_column(String(64), index=True)  # table name, e.g. "h100"
    device_name: Mapped[str] = mapped_column(String(128))
    fp32_tflops: Mapped[float] = mapped_column(Float)
    dram_gbs: Mapped[float] = mapped_column(Float)
    measured: Mapped[datetime.datetime] = mapped_column(
        DateTime, default=lambda: datetime.datetime.now(datetime.timezone.utc))


class ConfigRow(Base):
    __tablename__ = "nm_kernel_configs"
    __table_args__ = (UniqueConstraint("name", "source_hash"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    params: Mapped[dict] = mapped_column(JSON)
    # sha256 of the kernel's generated source, its version line aside (codegen.source_hash)
    source_hash: Mapped[str] = mapped_column(String(64))
    nmgen_version: Mapped[str] = mapped_column(String(32))


class ProblemRow(Base):
    __tablename__ = "nm_problems"
    __table_args__ = (UniqueConstraint("gpu_id", "template_hash", "n", "m", "vec", "dtype",
                                       "a_layout", "rows", "cols", "depth"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    gpu_id: Mapped[int] = mapped_column(ForeignKey("nm_gpus.id"))
    template_hash: Mapped[str] = mapped_column(String(64))
    n: Mapped[int] = mapped_column(Integer)
    m: Mapped[int] = mapped_column(Integer)
    vec: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(16))
    a_layout: Mapped[str] = mapped_column(String(8))
    rows: Mapped[int] = mapped_column(Integer)  # M
    cols: Mapped[int] = mapped_column(Integer)  # N
    depth: Mapped[int] = mapped_column(Integer)  # K
    gpu: Mapped[GpuRow] = relationship()


class TrialRow(Base):
    __tablename__ = "nm_trials"
    # One result per configuration and problem, however many workers tune it.
    __table_args__ = (UniqueConstraint("problem_id", "config_id"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("nm_problems.id"), index=True)
    config_id: Mapped[int] = mapped_column(ForeignKey("nm_kernel_configs.id"))
    status: Mapped[str] = mapped_column(String(32))
    time_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    tflops: Mapped[float | None] = mapped_column(Float, nullable=True)  # dense-equivalent
    model_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created: Mapped[datetime.datetime] = mapped_column(
        DateTime, default=lambda: datetime.datetime.now(datetime.timezone.utc))
    problem: Mapped[ProblemRow] = relationship()
    config_row: Mapped[ConfigRow] = relationship()
