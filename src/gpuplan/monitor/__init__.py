"""The GPU idle watch agent: samplers -> idle policy -> actions.

Public API (everything else is internal)::

    readings   State, GpuReading, GpuSample, Observation   tri-state readings keyed by UUID
    samplers   Sampler, SmiSampler, FakeSampler            (+ nvml.NvmlSampler, prometheus.PrometheusSampler)
    policy     PolicyConfig, IdlePolicy, Decision          the pure idle state machine
    actions    ActionPlan, CommandAction, WebhookAction, PreStopHook  (+ aws.AwsStopAction, AsgScaleInAction)
    cloud      build_cloud_action                          Alibaba Cloud / Tencent Cloud stop and scale-in
    daemon     Agent                                       the loop, with injectable clock and sleep
    clock      FakeClock, SystemClock                      FakeClock/FakeSampler are public test fakes
    replay     run_replay, contract_record                 the ``--replay`` contract
    fleet      FleetPolicy, FleetAgent (fleet_agent)       group scale-in from Prometheus

Importing this package imports no optional dependency (pynvml, boto3,
prometheus-client and the Alibaba/Tencent SDKs are imported only by the modules
that need them).
"""

from gpuplan.monitor.actions import ActionPlan, CommandAction, PreStopHook, WebhookAction
from gpuplan.monitor.clock import FakeClock, SystemClock
from gpuplan.monitor.daemon import Agent
from gpuplan.monitor.fleet import FleetConfig, FleetPolicy
from gpuplan.monitor.fleet_agent import FleetAgent
from gpuplan.monitor.policy import Decision, IdlePolicy, PolicyConfig
from gpuplan.monitor.readings import GpuReading, GpuSample, Observation, State
from gpuplan.monitor.replay import contract_record, run_replay
from gpuplan.monitor.samplers import FakeSampler, Sampler, SmiSampler

__all__ = [
    "ActionPlan",
    "Agent",
    "CommandAction",
    "Decision",
    "FakeClock",
    "FakeSampler",
    "FleetAgent",
    "FleetConfig",
    "FleetPolicy",
    "GpuReading",
    "GpuSample",
    "IdlePolicy",
    "Observation",
    "PolicyConfig",
    "PreStopHook",
    "Sampler",
    "SmiSampler",
    "State",
    "SystemClock",
    "WebhookAction",
    "contract_record",
    "run_replay",
]
