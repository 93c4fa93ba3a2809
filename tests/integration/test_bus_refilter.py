"""A durable made before a subject changed is pointed at the new filter when the streams are declared."""

from __future__ import annotations

from nats.js.api import AckPolicy, ConsumerConfig

from libs.runtime import bus


async def test_a_durable_with_an_old_filter_is_updated_when_the_streams_are_declared(env):
    settings = env.settings()
    s = settings.subjects
    nc = await bus.connect(settings.nats_url, "test")
    try:
        js = nc.jetstream()
        await bus.ensure_streams(js, s)
        stream = s.stream_name("PROGRESS")
        old = f"{s.prefix}.progress.*"
        await js.update_stream(name=stream, subjects=[old, s.progress_all])  # as before the change, and now
        await js.add_consumer(stream, config=ConsumerConfig(name="queue-progress", durable_name="queue-progress",
                                                            filter_subject=old, ack_policy=AckPolicy.EXPLICIT))
        await bus.ensure_streams(js, s)
        assert (await js.consumer_info(stream, "queue-progress")).config.filter_subject == s.progress_all
        assert (await js.stream_info(stream)).config.subjects == [s.progress_all]
    finally:
        await nc.close()
