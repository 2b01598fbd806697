"""Versioned wire contracts: commands (imperative) and events (past tense), discriminated on ``kind``.

Parse only at the edge with :func:`decode_message`; a message that fails yields exactly one
:class:`~shared.domain.errors.InvalidMessage` naming the field and the fix, and nothing else.
"""

from shared.messages.contracts import (
    MAX_MESSAGE_BYTES,
    SCHEMA_VERSION,
    BenchmarkCompleted,
    BenchmarkRequest,
    Command,
    CreateDeployment,
    DeleteDeployment,
    DeploymentObserved,
    Event,
    Message,
    NodeBooted,
    PhaseChanged,
    ReconcileTick,
    RestartServing,
    RunBenchmark,
    ScheduleBenchmark,
    StartDeployment,
    StopDeployment,
    UpdateDeployment,
    decode_message,
    encode_message,
    message_attributes,
    new_command_id,
    topic_for,
)

__all__ = [
    "MAX_MESSAGE_BYTES",
    "SCHEMA_VERSION",
    "BenchmarkCompleted",
    "BenchmarkRequest",
    "Command",
    "CreateDeployment",
    "DeleteDeployment",
    "DeploymentObserved",
    "Event",
    "Message",
    "NodeBooted",
    "PhaseChanged",
    "ReconcileTick",
    "RestartServing",
    "RunBenchmark",
    "ScheduleBenchmark",
    "StartDeployment",
    "StopDeployment",
    "UpdateDeployment",
    "decode_message",
    "encode_message",
    "message_attributes",
    "new_command_id",
    "topic_for",
]
