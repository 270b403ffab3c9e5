"""The EnvRunner side: experience goes from the EnvRunner straight into Conduit's placement.

:func:`conduit_env_runner_class` subclasses the config's EnvRunner class (``env_runner_cls``, a
public extension point). Its ``sample()`` runs the stock sampler, packs what it returns into a chunk
(:mod:`conduit.runtime.rllib.layout`) and sends it to the plane of the learner's node with one
asynchronous call; the episodes never travel to the driver. What it returns instead:

* PPO: one zero-step *ticket* episode (PPO's ``training_step`` skips the update when the EnvRunners
  return nothing, so they return a placeholder with the chunk ids);
* APPO, IMPALA, DQN, SAC: nothing (their training loops count steps from the EnvRunner metrics).

Episode metrics, step counters and callbacks are the stock sampler's (they are computed before
``sample()`` returns). Evaluation EnvRunners (``config.in_evaluation``) are left alone.

For PPO a sample call is streamed in sub-chunks of ``plan.stream_chunk_steps(...)`` env steps (``chunk_steps``,
or the policy's given ``target_chunk_bytes`` at this layout's bytes per step: :mod:`conduit.deploy_settings`,
shared with the simulator): ``sample()`` calls the stock
sampler repeatedly for the same total number of steps. Each call cuts ongoing episodes; the
learner joins the pieces again by episode id, so the train batch is the one stock RLlib builds,
while the learner already works on the first sub-chunks as the later ones are sampled.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from typing import Any, ClassVar

from conduit.errors import ConduitError, FlushTimeout
from conduit.runtime.rllib.layout import TRAJECTORY, TransitionPacker, pack_trajectories
from conduit.runtime.rllib.plan import Plan

log = logging.getLogger(__name__)  # conduit.runtime.rllib.env_runner

TICKET_KEY = "conduit_ticket"
MAX_IN_FLIGHT = 16  # unacknowledged chunks per EnvRunner before sample() waits for the plane


class ConduitEnvRunnerMixin:
    """Mixed in front of the config's EnvRunner class by :func:`conduit_env_runner_class`."""

    conduit_plan: ClassVar[Plan]
    _conduit_env_runner = True

    def conduit_attach(self, cluster: Any, schema: Any, learner: str) -> None:
        """Called by the driver's callback once the plane runs: where this runner's chunks go."""
        self._cd_cluster = cluster
        self._cd_schema = schema
        self._cd_learner = learner
        self._cd_seq = itertools.count()
        self._cd_steps = 0
        self._cd_sender: _Sender | None = None  # started by the first sample (the driver's local runner never samples)

    def sample(self, *, num_timesteps: int | None = None, num_episodes: int | None = None, explore: bool | None = None,
               random_actions: bool = False, force_reset: bool = False) -> list:
        if getattr(self.config, "in_evaluation", False):
            return super().sample(num_timesteps=num_timesteps, num_episodes=num_episodes, explore=explore,
                                  random_actions=random_actions, force_reset=force_reset)
        if getattr(self, "_cd_cluster", None) is None:
            raise ConduitError("this EnvRunner was built by conduit.runtime.rllib.enable() but never attached to a "
                               "plane: build the algorithm with config.build_algo() so the Conduit callback runs")
        plan = self.conduit_plan
        ids: list[Any] = []
        steps = 0
        kw = {"explore": explore, "random_actions": random_actions}
        if plan.chunk_steps and num_episodes is None:
            total = num_timesteps or self.config.get_rollout_fragment_length(self.worker_index) * self.num_envs
            chunk = plan.stream_chunk_steps(total, self.num_envs, self._cd_schema.step_bytes)
            first = True
            while steps < total:
                n = min(chunk, total - steps)
                episodes = super().sample(num_timesteps=n, force_reset=force_reset and first, **kw)
                first = False
                got = self._cd_push(episodes, ids)
                if got == 0:  # the sampler returned nothing: do not spin
                    break
                steps += got
        else:
            episodes = super().sample(num_timesteps=num_timesteps, num_episodes=num_episodes,
                                      force_reset=force_reset, **kw)
            steps += self._cd_push(episodes, ids)
        if self._cd_sender is not None:
            self._cd_sender.check()
        if not plan.returns_ticket:
            return []
        from ray.rllib.env.single_agent_episode import SingleAgentEpisode

        ticket = SingleAgentEpisode()
        ticket.custom_data[TICKET_KEY] = {"runner": self.worker_index, "steps": steps, "chunks": ids,
                                          "version": int(self._weights_seq_no)}
        return [ticket]

    def _cd_push(self, episodes: list, ids: list) -> int:
        """Hand the sample to the sender thread; returns its env steps (the RPC need not wait for the send)."""
        steps = sum(len(e) for e in episodes)
        if steps:
            tag = getattr(self._cd_cluster, "run_tag", None)  # unique per plane: a restored table's ids stay unique
            cid = f"r{self.worker_index}-{tag}-{next(self._cd_seq)}" if tag else f"r{self.worker_index}-{next(self._cd_seq)}"
            if self._cd_sender is None:
                self._cd_sender = _Sender(self)
            self._cd_sender.send(episodes, int(self._weights_seq_no), cid, time.time())
            ids.append(cid)
            self._cd_steps += steps
        return steps

    def stop(self) -> None:
        """``algo.stop()``: what the sender still holds goes to the plane before the runner ends."""
        if getattr(self, "_cd_sender", None) is not None:
            with contextlib.suppress(Exception):  # the plane may be gone already; stopping must not fail
                self.conduit_flush()
        if getattr(self, "_cd_cluster", None) is not None and self.worker_index == 0:
            # the driver's local runner: the algorithm is stopping (Algorithm.cleanup stops the EnvRunners
            # after the learners), so its plane actors end too, final audit recorded (callbacks.stop_plane)
            from conduit.runtime.rllib.callbacks import stop_plane

            try:
                stop_plane(self._cd_cluster)
            except Exception as exc:  # noqa: BLE001 - stopping must not fail; the actors die with the driver
                import logging

                logging.getLogger("conduit.runtime.rllib").warning("could not stop the plane: %r", exc)
        super().stop()

    def conduit_flush(self, timeout: float | None = None) -> int:
        """Wait until every chunk this runner sent is in the plane; returns the steps sent so far.

        ``timeout`` (default: the plan's ``ingest_timeout`` plus ``restart_timeout``, the longest one
        chunk may wait for room and for a restarted plane) bounds the whole wait: past it,
        :class:`~conduit.errors.FlushTimeout`, with every unacknowledged chunk still held and sent."""
        if self._cd_sender is not None:
            if timeout is None:
                o = self.conduit_plan.options
                timeout = float(o.get("ingest_timeout", 120.0)) + float(o.get("restart_timeout", 120.0))
            self._cd_sender.flush(timeout)
        return self._cd_steps


class _Sender:
    """The EnvRunner's sending thread: packs samples into chunks and sends them to the plane, in order.

    It keeps at most :data:`MAX_IN_FLIGHT` chunks unacknowledged (then it waits: backpressure from
    the plane reaches the sampler), and a refused chunk (schema, capacity, a full plane) is raised by
    the runner's next ``sample()`` call, with the plane's message.

    **Plane restarts.** It keeps each unacknowledged chunk's payload until the plane acknowledges it.
    A send that fails because the plane's process died (Ray's ``RayActorError``) is sent again, with
    the same chunk id, once the restarted plane answers (:meth:`PlaneCluster.ingest` waits for it,
    within ``max_restarts`` and ``restart_timeout``). If the first send had been committed before the
    death, the plane answers :class:`~conduit.errors.DuplicateChunkError`: the chunk is already
    accounted for (taken over from the spill tier, or counted lost by the audit), so that is a success.
    """

    def __init__(self, runner: ConduitEnvRunnerMixin):
        import queue

        self.runner = runner
        self.queue: queue.Queue = queue.Queue(maxsize=MAX_IN_FLIGHT)
        self.in_flight: list[Any] = []
        self.resend: dict[Any, Any] = {}  # unacknowledged ref -> how to send that chunk again
        self.acks = threading.Lock()  # in_flight/resend: the sending thread and flush() both settle
        self.error: BaseException | None = None
        self.packer: TransitionPacker | None = None  # Replay: n-step windows across sample calls
        self.thread = threading.Thread(target=self._run, name="conduit-sender", daemon=True)
        self.thread.start()

    def send(self, episodes: list, version: int, cid: str, t_created: float) -> None:
        self.check()
        self.queue.put((episodes, version, cid, t_created))

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def flush(self, timeout: float | None = None) -> None:
        """Wait until the thread has sent everything queued and the plane acknowledged every chunk,
        within ``timeout`` seconds in all (None: no deadline); past it, :class:`FlushTimeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        done = self.queue.all_tasks_done
        with done:
            while self.queue.unfinished_tasks:
                if left() == 0.0:
                    raise FlushTimeout(f"EnvRunner {self.runner.worker_index}: {self.queue.unfinished_tasks} sample "
                                       f"call(s) not yet sent to the plane after {timeout:.3g} s")
                done.wait(left())
        self._settle(leave=0, timeout=left())
        self.check()

    def _run(self) -> None:
        window = self.runner.conduit_plan.options.get("coalesce_s", 0.0) or 0.0
        while True:
            items = self._gather(window)
            try:
                if self.error is None:
                    for group in self._groups(items):
                        # one chunk: the group's episode pieces, its first id, its oldest sample's time
                        self._send([e for i in group for e in i[0]], group[0][1], group[0][2], group[0][3])
            except BaseException as exc:  # noqa: BLE001 - raised by the runner's next sample()
                log.warning("sending experience to the plane failed: %r (raised by the runner's next sample())", exc)
                self.error = exc
            finally:
                for _ in items:
                    self.queue.task_done()

    def _groups(self, items: list[tuple]) -> list[list[tuple]]:
        """The chunks to send. Trajectories (PPO, APPO, IMPALA): one per run of sample calls with the
        same weights version, since their contracts judge a chunk by its version. Transitions (DQN,
        SAC): one for all of them, labelled with the oldest version among them. Replay bounds no
        staleness, and DQN syncs weights after every update, so per-version chunks would mean one plane
        call per env step; the oldest version is the conservative label."""
        if self.runner.conduit_plan.layout == TRAJECTORY:
            return _same_version_runs(items)
        oldest = min(item[1] for item in items)
        return [[(items[0][0], oldest, items[0][2], items[0][3]), *items[1:]]]

    def _gather(self, window: float) -> list[tuple]:
        """The next sample call's data, plus (Replay) whatever else arrives within ``window`` seconds: a
        one-step sample call per env step would otherwise be one plane call per step."""
        import queue

        while True:  # idle: look at the acknowledgements, so a send lost with a dead plane is sent again now
            try:
                items = [self.queue.get(timeout=0.25)]
                break
            except queue.Empty:
                if self.in_flight and self.error is None:
                    try:
                        self._settle(leave=MAX_IN_FLIGHT)
                    except BaseException as exc:  # noqa: BLE001 - raised by the runner's next sample()
                        log.warning("sending experience to the plane failed: %r (raised by the runner's next "
                                    "sample())", exc)
                        self.error = exc
        deadline = time.monotonic() + window
        while window and len(items) < MAX_IN_FLIGHT:
            try:
                items.append(self.queue.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                break
        return items

    def _send(self, episodes: list, version: int, cid: str, t_created: float) -> None:
        r = self.runner
        plan = r.conduit_plan
        if plan.layout == TRAJECTORY:
            payload, annotation = pack_trajectories(episodes, r._cd_schema, version)
        else:
            if self.packer is None:
                self.packer = TransitionPacker(r._cd_schema, plan.n_step, plan.gamma)
            payload, annotation = self.packer.pack(episodes), None
        if not payload:  # every step is carried until its n-step window is complete
            return
        kw = {"policy_version": version, "chunk_id": cid, "producer": f"env_runner{r.worker_index}",
              "learner": r._cd_learner, "t_created": t_created, "annotation": annotation}
        ref = r._cd_cluster.ingest_async(payload, **kw)
        if isinstance(ref, _object_ref_type()):  # (an in-process plane answers at once)
            self.in_flight.append(ref)
            self.resend[ref] = (payload, kw)
            self._settle(leave=MAX_IN_FLIGHT)

    def _settle(self, *, leave: int, timeout: float | None = None) -> None:
        """Wait until at most ``leave`` chunks are unacknowledged (within ``timeout`` seconds, None: no
        deadline; past it, :class:`FlushTimeout` with the rest still held); a refused chunk raises here."""
        import ray

        with self.acks:
            if len(self.in_flight) > leave:
                ready, self.in_flight = ray.wait(self.in_flight, num_returns=len(self.in_flight) - leave,
                                                 timeout=timeout)
            elif self.in_flight:
                ready, self.in_flight = ray.wait(self.in_flight, num_returns=len(self.in_flight), timeout=0)
            else:
                return
            self._settled(ready)
            if len(self.in_flight) > leave:
                raise FlushTimeout(f"EnvRunner {self.runner.worker_index}: {len(self.in_flight)} chunk(s) not "
                                   f"acknowledged by the plane after {timeout:.3g} s")

    def _settled(self, ready: list) -> None:
        import ray

        for ref in ready:
            payload, kw = self.resend.pop(ref)
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:  # the plane died with it in flight: send it again
                self._send_again(payload, kw)

    def _send_again(self, payload: Any, kw: dict[str, Any]) -> None:
        from conduit.errors import DuplicateChunkError

        log.info("plane restarted: sending chunk %r again", kw["chunk_id"])
        try:
            self.runner._cd_cluster.ingest(payload, **kw)  # waits for the restarted plane (bounded)
        except DuplicateChunkError:
            pass  # committed before the death: already accounted for


def _object_ref_type() -> type:
    import ray

    return ray.ObjectRef


def _same_version_runs(items: list[tuple]) -> list[list[tuple]]:
    """Consecutive items with the same weights version (a chunk carries one version)."""
    runs: list[list[tuple]] = []
    for item in items:
        if runs and runs[-1][0][1] == item[1]:
            runs[-1].append(item)
        else:
            runs.append([item])
    return runs


def conduit_env_runner_class(base: type, plan: Plan) -> type:
    """``Conduit<Base>``: ``base`` (an EnvRunner class) whose ``sample()`` feeds Conduit."""
    if getattr(base, "_conduit_env_runner", False):
        base = base.__bases__[1]  # re-enabling: wrap the original class again, with the new plan
    name = f"Conduit{base.__name__}"
    return type(name, (ConduitEnvRunnerMixin, base), {"__module__": __name__, "__qualname__": name,
                                                       "conduit_plan": plan})
