"""The control plane's codes and sentences on the panel's pages in the page's words (services/gateway/panel/words.py):
timeline and job reasons, the audit log's kinds and refusals, the queue's waiting sentence, check figures."""

from __future__ import annotations

import pytest

from libs.contracts import commands
from libs.contracts.jobs import AttemptCause, JobState
from services.gateway.panel import fleet, i18n, words

pytestmark = pytest.mark.unit

PT = "pt-BR"


@pytest.mark.parametrize(("reason", "said"), [
    ("transport_lost", "Perda de transporte"), ("node_failure", "Falha de nó"), ("gpu_ceiling", "teto de GPU atingido"),
    ("ceiling_raised", "teto aumentado"), ("lease expired", "a concessão expirou"),
    ("stopped by executor", "parado pelo executor"), ("abandoned", "abandonado pelo executor"),
    ("every worker lost a peer", "todos os workers perderam um par"), ("cancelled by operator", "cancelado pelo operador"),
    ("handed back: busy", "devolvido sem iniciar: ocupado"), ("exit code 3", "código de saída 3"),
    ("node failed: lease expired", "o nó falhou: a concessão expirou"),
    ("undeliverable: payload too large", "impossível de entregar: payload too large"),
    ("succeeded", "concluído"), ("drained by operator", "drenado pelo operador"),
    ("cordoned for run r-1", "isolado para a verificação r-1"),
    ("not started: the executor is busy with job j-7",
     "não iniciado: o executor está ocupado com o job j-7"),  # an agent's hand-back, as the timeline shows it
])
def test_a_reason_is_said_in_portuguese(reason, said):
    assert words.reason(reason, PT) == said
    assert words.reason(reason, "en") != said


@pytest.mark.parametrize("text", ["parei porque quis", "ValueError: bad batch", "<b>x</b>", "lease expired soon",
                                  "unknown_code_from_tomorrow"])
def test_what_no_pattern_knows_is_shown_as_written(text):
    assert words.reason(text, PT) == text and words.audit_reason(text, PT) == text


def test_every_attempt_cause_and_state_has_portuguese_words():
    for code in [*(c.value for c in AttemptCause), *(s.value for s in JobState)]:
        assert words.reason(code, PT) != code, code


def test_every_command_kind_of_the_audit_log_has_words_in_both_languages():
    kinds = {c.KIND for c in vars(commands).values() if isinstance(c, type) and getattr(c, "KIND", "")}
    assert {"submit", "cancel", "requeue", "drain_node", "set_policy"} <= kinds
    for kind in kinds | {"dead_letter_replay", "token_create", "token_revoke"}:
        assert words.audit_kind(kind, PT) != kind and words.audit_kind(kind, "en") != kind, kind
    assert words.audit_kind("made_up", PT) == "made_up" and words.audit_kind(None, PT) is None


@pytest.mark.parametrize(("reason", "said"), [
    ("role 'viewer' lacks permission 'finetune:manage'", "o papel leitor não tem a permissão finetune:manage"),
    ("job j-1 belongs to 'ana'; cancelling it needs 'finetune:manage'",
     "o job j-1 pertence a ana; cancelá-lo exige finetune:manage"),
    ("new ceiling 10s is below consumed + 60s = 63.5s", "o novo teto de 10 s está abaixo do consumido + 60 s = 63,5 s"),
    ("only an interrupted job can be requeued; this job is running",
     "só um job interrompido pode ser recolocado na fila; este está Executando"),
    ("no such job: abc", "job inexistente: abc"), ("job already succeeded", "o job já está Concluído"),
    ("unknown or revoked token", "token desconhecido ou revogado"),
    ("lease expired", "a concessão expirou"),
])
def test_an_audit_refusal_is_said_in_portuguese(reason, said):
    assert words.audit_reason(reason, PT) == said


def test_the_sentences_match_what_the_producers_write():
    """The patterns read the exact sentences of their producers (the same f-strings, filled)."""
    from services.queue.domain import ceiling
    minimum = 3.5 + ceiling.REQUEUE_MARGIN_SECONDS
    queue = f"new ceiling {10.0:g}s is below consumed + {ceiling.REQUEUE_MARGIN_SECONDS:g}s = {minimum:g}s"
    auth = f"role {'submitter'!r} lacks permission {'finetune:manage'!r}"
    assert words.audit_reason(queue, PT).startswith("o novo teto de 10 s")
    role = i18n.translate(PT, "common.role_submitter")
    assert words.audit_reason(auth, PT) == f"o papel {role} não tem a permissão finetune:manage"


@pytest.mark.parametrize(("sentence", "said"), [
    ("no ready node has 1 GPUs", "nenhum nó pronto tem 1 GPUs"),
    ("behind 3 jobs of higher priority or fair share: no free node of 0 GPUs for 1 worker(s) now",
     "atrás de 3 jobs de maior prioridade ou parcela justa: nenhum nó livre de 0 GPUs para 1 worker(s) agora"),
    ("quota: organisation acme holds 4 of its 6 devices in node group g (nominal 4 + borrowing 2), job needs 4",
     "cota: a organização acme usa 4 dos seus 6 dispositivos no grupo de nós g (nominal 4 + empréstimo 2); "
     "o job precisa de 4"),
    ("organisation x does not exist", "a organização x não existe"),
    ("cohort c: 3 of the 4 shared devices of node group g are in use, job needs 2 of them",
     "coorte c: 3 dos 4 dispositivos compartilhados do grupo de nós g estão em uso; o job precisa de 2"),
])
def test_the_queues_waiting_sentence_is_said_in_portuguese(sentence, said):
    assert words.waiting({"code": "x", "reason": sentence}, PT) == said
    assert words.waiting({"code": "x", "reason": sentence}, "en") == sentence


def test_a_waiting_sentence_no_pattern_knows_is_left_out_in_portuguese():
    assert words.waiting({"code": "behind", "reason": "a sentence of tomorrow"}, PT) is None
    assert words.waiting({"code": "behind", "reason": ""}, PT) is None and words.waiting(None, PT) is None


@pytest.mark.parametrize(("name", "said"), [
    ("rel_error_bfloat16", "Erro relativo (bfloat16)"), ("rel_error_float32", "Erro relativo (float32)"),
    ("max_rtt_ms", "Maior tempo de ida e volta (ms)"), ("peers", "Pares"), ("reached", "Pares alcançados"),
    ("tested_mb", "Memória testada (MB)"), ("errors", "Erros"), ("bytes", "Bytes"), ("seconds", "Segundos"),
    ("gpu0_temperature_c", "GPU 0: temperatura (°C)"), ("gpu3_ecc_uncorrected", "GPU 3: erros ECC não corrigidos"),
    ("gpu1_power_w", "GPU 1: potência (W)"), ("gpu1_sm_clock_mhz", "GPU 1: clock dos SMs (MHz)"),
])
def test_a_check_figure_without_a_name_on_the_nodes_page_is_said_in_portuguese(name, said):
    assert fleet.metric_label(name)[0] is None  # the nodes page's own table does not name it
    assert words.metric(name, PT) == said
    assert words.metric("made_up_figure", PT) == "made_up_figure"


def test_every_pattern_and_code_has_its_words_in_both_catalogues():
    keys = {k for _, k in (*words.REASONS, *words.AUDIT_REASONS, *words.WAITING)}
    for locale in i18n.LOCALES:
        catalogue = i18n.catalogue(locale)
        assert {f"terms.{k}" for k in keys} <= set(catalogue), locale


@pytest.mark.parametrize(("error", "said"), [
    ("nvidia-ml-py is not installed: no NVML readings", "nvidia-ml-py não está instalado: sem leituras da NVML"),
    ("no NVIDIA GPU on this node (NVMLError_LibraryNotFound)", "nenhuma GPU NVIDIA neste nó (NVMLError_LibraryNotFound)"),
    ("no other node in the group to reach", "nenhum outro nó no grupo para alcançar"),
    ("a single node in this run: no collective to measure",
     "um só nó nesta verificação: nenhuma operação coletiva para medir"),
    ("GPU 0: temperature 95 C above 90", "GPU 0: temperature 95 C above 90"),  # a failure's own words
])
def test_a_test_that_does_not_apply_says_why_in_portuguese(error, said):
    assert words.check_error(error, PT) == said


@pytest.mark.parametrize(("reason", "said"), [
    ("exit status 3", "código de saída 3"), ("exit status 1: Traceback ...\nValueError: x",
                                             "código de saída 1: Traceback ...\nValueError: x"),
    ("killed by signal 9", "morto pelo sinal 9"),
])
def test_the_agents_exit_status_is_said_in_portuguese_and_the_programs_own_words_kept(reason, said):
    assert words.reason(reason, PT) == said


@pytest.mark.parametrize(("problem", "said"), [
    ("1 executor(s) without signal", "1 executor(es) sem sinal"),
    ("queue: no replica answered", "queue: nenhuma réplica respondeu"),
    ("queue: nobody holds singleton queue-placement", "queue: ninguém detém o singleton queue-placement"),
    ("budget: replica b-1 did not answer (last seen 12 s ago)",
     "budget: a réplica b-1 não respondeu (vista pela última vez há 12 s)"),
    ("stream JOB: no leader", "stream JOB: sem líder"),
    ("stream JOB: replica on n2 is behind (40 operations)", "stream JOB: a réplica em n2 está atrasada (40 operações)"),
    ("nats member node-3 (127.0.0.1:4222) did not answer: timeout",
     "o membro NATS node-3 (127.0.0.1:4222) não respondeu: timeout"),
    ("something new", "something new"),
])
def test_a_control_plane_problem_is_said_in_portuguese(problem, said):
    assert words.problem(problem, PT) == said


def test_the_status_problems_match_what_the_status_gathering_writes():
    from services.gateway.domain import status
    source = open(status.__file__, encoding="utf-8").read()
    for fragment in ("executor(s) without signal", ": no replica answered", ": nobody holds singleton ", ": no leader",
                     "did not answer \"", "is behind ("):
        assert fragment.rstrip('"') in source, fragment
