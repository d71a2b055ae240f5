"""What the bundled sample stream says: four people in two organizations, over a few days.

Only data lives here; `memoryd.sample_stream` turns it into events. Each persona's script is
in the order things happen, so a correction always comes after what it corrects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Say:
    """The chat agent records an observation (`record_observation`)."""

    category: str
    text: str
    connection_id: str | None = None


@dataclass(frozen=True)
class Inbox:
    """One autonomous inbox cycle (`update_user_context`)."""

    scaffold: dict[str, Any] = field(default_factory=dict)
    learned: tuple[str, ...] = ()


@dataclass(frozen=True)
class Tool:
    """A tool result or an attachment's text (`index_tool_output`)."""

    tool_id: str
    text: str
    attachment_id: str | None = None
    filename: str | None = None
    connection_id: str | None = None


@dataclass(frozen=True)
class Note:
    """Something learned about one tool connection (`update_connection_context`)."""

    connection_id: str
    text: str


Line = Say | Inbox | Tool | Note


@dataclass(frozen=True)
class Persona:
    user_id: str
    organization_id: str
    script: tuple[Line, ...]


ONBOARDING_BRIEF = """Northwind Mobile: Onboarding Redesign Brief (v3)

The redesigned onboarding flow must lift day-7 activation from 31 percent to 40 percent by the \
end of Q4. The current flow asks for six permissions up front and loses a third of new users \
before the first transfer.

Scope. Replace the six-screen carousel with a three-step checklist: verify identity, add a \
funding source, send a first transfer. Permissions are requested in context, at the step that \
needs them. Copy is rewritten at a reading age of twelve.

Research. Five moderated usability sessions in Lisbon and two remote sessions in Porto are \
planned for the week of November 9. Recruiting goes through the research ops panel; incentives \
are 40 euros per session.

Milestones. Hi-fi prototype ready for critique on November 6. Usability sessions November 9-11. \
Handoff of final specs and the Figma library to the mobile developers on November 14. Staged \
rollout to 10 percent of new sign-ups on November 24.

Risks. The identity-verification vendor caps retries at three per day, which the checklist must \
explain. Legal has not yet approved the new consent copy. Android back-navigation behaves \
differently inside the verification web view.

Owners. Design: Maya Okafor. Product: Jonas Weber. Mobile lead: Sofia Marques. Research: Inês \
Duarte."""

RUNBOOK = """Payments ledger: on-call runbook excerpt

When the settlement reconciliation job reports a mismatch, first check the idempotency-key table \
for duplicate captures from the last 24 hours. Most mismatches since September were caused by \
the card network replaying webhooks after a timeout.

Escalate to the payments platform lead if the mismatch exceeds 500 euros or touches more than \
20 merchants. Never re-run the settlement job by hand during the 02:00-03:00 UTC batch window."""

TERM_SHEET = """Helix Labs: seed round term sheet summary (draft for partners)

Lead investor Northstar Climate Ventures proposes a 3.2 million euro seed round at a 14 million \
euro pre-money valuation, with a 10 percent option pool created before the round.

The lead takes one board seat; the board will have two founders and one investor. Standard 1x \
non-participating liquidation preference. Closing is targeted for December 12, subject to \
confirmatory diligence on the data licensing agreements with the three weather agencies."""

THESIS_CHAPTER = """Chapter 3 draft: Probabilistic downscaling of precipitation with diffusion \
models

We train a conditional diffusion model to downscale ERA5 precipitation from 25 km to 2 km over \
the Alps, conditioning on orography and the coarse field. Compared with the quantile-mapping \
baseline, the model halves the continuous ranked probability score for extreme events above the \
99th percentile.

Evaluation uses the MeteoSwiss station network from 2015 to 2020 as held-out ground truth. \
Remaining issues: the model underestimates convective events in the Ticino valleys in summer, and \
sampling 50 ensemble members takes four GPU-hours per month of data."""


MAYA = Persona(
    user_id="maya.okafor",
    organization_id="northwind",
    script=(
        Say("fact", "My name is Maya Okafor, but everyone calls me Maya."),
        Say("fact", "I work in engineering on the platform team at Northwind."),
        Say("fact", "I live in Lisbon, in the Alfama neighbourhood."),
        Say("preference", "I prefer async updates over meetings before 11am."),
        Say("fact", "I've been at Northwind for three years."),
        Tool("calendar.list_events", "Weekly 1:1 with Priya Raman, Monday 11:30, recurring."),
        Say("project_details", "I'm leading the onboarding redesign for the Northwind mobile app."),
        Tool(
            "calendar.list_events",
            "Design critique: onboarding prototype, Thursday 15:00, "
            "room Tejo. Attendees: Maya Okafor, Jonas Weber, Sofia Marques.",
        ),
        Say("preference", "I drink oat flat whites, never dairy."),
        Say("fact", "I have a corgi named Biscuit who comes to the office on Fridays."),
        Inbox(
            {"Team": {"manager": "Priya Raman", "pod": "Activation"}},
            ("Maya is the design reviewer for every checkout change.",),
        ),
        Say(
            "project_details",
            "The hi-fi onboarding prototype needs to be ready for critique by November 6.",
        ),
        Say("correction", "Actually, I moved to design last month: I'm a product designer now."),
        Say("preference", "I like feedback as Figma comments rather than Slack threads."),
        Inbox(
            {"Tools": ["Figma", "Maze", "Linear"]},
            (
                "Maya owns the Figma component library for the Activation pod.",
                "Maya asked Sofia Marques for Android back-navigation recordings.",
            ),
        ),
        Say(
            "project_details",
            "The new checklist replaces the six-screen onboarding carousel "
            "with three steps: verify identity, add funding, send a first transfer.",
        ),
        Say("fact", "My manager at Northwind is Priya Raman.", connection_id="gmail-work"),
        Note("gmail-work", "Maya files vendor invoices under the label Finance/Vendors."),
        Tool(
            "gmail.read_attachment",
            ONBOARDING_BRIEF,
            attachment_id="att-onb-brief-v3",
            filename="Onboarding-Redesign-Brief-v3.pdf",
            connection_id="gmail-work",
        ),
        Say(
            "project_details",
            "The handoff of final specs to the mobile developers is due on November 14.",
        ),
        Say("preference", "I really prefer async updates over meetings before 11am."),
        Inbox(
            {"Goals": ["Lift day-7 activation to 40%", "Run 5 usability sessions in Lisbon"]},
            (
                "Maya usually answers email between 4pm and 6pm Lisbon time.",
                "Maya is recruiting usability participants through research ops.",
            ),
        ),
        Say("fact", "I'm vegetarian, so team lunches need a veggie option."),
        Say("preference", "I'd rather get one consolidated review than drip-fed comments."),
        Tool(
            "linear.issue",
            "ACT-812 'Explain verification retry limit in checklist' assigned "
            "to Maya Okafor, priority high, due November 12.",
        ),
        Say(
            "project_details",
            "I need to write copy that explains the vendor's limit of three "
            "verification retries per day.",
        ),
        Say(
            "project_details",
            "I need to book the research lab for the usability sessions on November 9 to 11.",
        ),
        Tool(
            "slack.search",
            "Jonas Weber: legal still has not approved the new consent copy for "
            "onboarding. Will chase on Monday.",
        ),
        Say("fact", "I speak Portuguese and English, and I'm learning Japanese."),
        Say("preference", "For design reviews I want the prototype link first and context after."),
        Inbox(
            {"Team": {"design_partner": "Inês Duarte"}},
            ("Maya's design critiques happen on Thursdays at 15:00.",),
        ),
        Say(
            "project_details",
            "Usability findings so far: users skip the funding step when it "
            "comes before identity verification.",
        ),
        Say("fact", "I live in Lisbon, Alfama."),
        Inbox(
            {"Team": {"mobile_lead": "Sofia Marques"}},
            ("Maya's prototype critique on November 6 went well; two flows need rework.",),
        ),
        Say("preference", "I like working from the Alfama café on Tuesday mornings."),
        Tool(
            "slack.search",
            "Sofia Marques: Android back button exits the verification web "
            "view; fix scoped for sprint 46.",
        ),
        Say(
            "project_details",
            "I have to present the onboarding results at the all-hands on November 20.",
        ),
        Note("gmail-work", "Recruiting emails for usability sessions come from research-ops@."),
        Say("preference", "I like oat flat whites, never dairy milk."),
        Say(
            "project_details",
            "The staged rollout of the new onboarding to 10% of sign-ups is "
            "planned for November 24.",
        ),
        Inbox(
            {"Focus this week": "Usability sessions and consent copy sign-off"},
            ("Maya is waiting on legal to approve the onboarding consent copy.",),
        ),
        Say("fact", "I'm a product designer on the Activation pod."),
        Tool(
            "calendar.list_events",
            "Usability session 3 of 5 moved to Wednesday 10:00 because "
            "the participant is travelling.",
        ),
        Say("preference", "Please keep summaries to three bullet points."),
        Say(
            "project_details",
            "Usability sessions are done: 4 of 5 participants finished the checklist without help.",
        ),
        Inbox(
            {"Focus this week": "Final specs and Figma library handoff"},
            ("Legal approved the onboarding consent copy on November 13.",),
        ),
        Say("fact", "I'm taking a week off in Japan from December 8."),
        Say(
            "project_details",
            "I need to hand the Figma library to Sofia's developers on "
            "November 14 along with the final specs.",
        ),
        Say("preference", "Keep my Fridays free for design system work."),
    ),
)

OMAR = Persona(
    user_id="omar.haddad",
    organization_id="northwind",
    script=(
        Say("fact", "I'm a backend engineer on the payments platform team at Northwind."),
        Say("fact", "I live in Amsterdam and cycle to the office."),
        Say("preference", "I write services in Go and prefer Postgres over anything NoSQL."),
        Say("fact", "I've been at Northwind for five years, always on payments."),
        Tool(
            "calendar.list_events",
            "Ledger migration sync, Tuesdays 14:00, with the data platform team.",
        ),
        Say("project_details", "I'm migrating the settlement ledger from MySQL to Postgres."),
        Say(
            "project_details",
            "The ledger migration cutover needs to happen before the December 1 freeze.",
        ),
        Inbox(
            {"On-call": {"rotation": "payments-primary", "next_shift": "2026-11-03"}},
            ("Omar is primary on-call for payments every third week.",),
        ),
        Say("preference", "I prefer code review comments that suggest a concrete change."),
        Tool(
            "confluence.read_page",
            RUNBOOK,
            attachment_id="page-ledger-runbook",
            filename="Payments-ledger-runbook.html",
        ),
        Say("fact", "I drink espresso, two in the morning and none after 2pm."),
        Say(
            "project_details",
            "Reconciliation mismatches since September came from replayed "
            "card webhooks; I need to add idempotency keys to the capture path.",
        ),
        Say("fact", "I have a daughter, Lina, who starts school in January."),
        Say("preference", "I want design docs in Markdown in the repo, not in Google Docs."),
        Tool(
            "grafana.alert",
            "Alert resolved: capture-service p99 latency above 400ms for 12 "
            "minutes on November 2, 14:05 UTC.",
        ),
        Inbox(
            {"Goals": ["Finish ledger migration", "Cut p99 capture latency below 300ms"]},
            ("Omar is the reviewer of record for changes to the capture service.",),
        ),
        Say("preference", "I like my morning free of meetings until 10:30."),
        Say(
            "project_details",
            "Capture latency p99 is 420ms; the target is below 300ms by the end of Q4.",
        ),
        Say("fact", "I'm a backend engineer on Northwind's payments platform team."),
        Tool(
            "pagerduty.incidents",
            "Incident PAY-2291 resolved: settlement job delayed 40 "
            "minutes by a lock on the payouts table. Owner: Omar Haddad.",
        ),
        Say("correction", "Correction: I live in Utrecht now and commute to Amsterdam."),
        Say("preference", "I speak Arabic, Dutch and English; English for anything written."),
        Note(
            "github-northwind",
            "Omar's team uses the payments-platform CODEOWNERS group for ledger reviews.",
        ),
        Say("project_details", "Dry run of the ledger cutover is scheduled for November 18."),
        Inbox(
            {"Team": {"lead": "Marta Kowalski", "size": 7}},
            (
                "Omar's team lead is Marta Kowalski.",
                "Omar reviews database migrations for the whole payments group.",
            ),
        ),
        Say(
            "project_details",
            "The ledger cutover plan has a 30 minute write freeze and a "
            "rollback switch per merchant cohort.",
        ),
        Inbox(
            {"On-call": {"next_shift": "2026-11-24"}},
            ("Omar has asked to swap his on-call week around the December freeze.",),
        ),
        Say("fact", "I mentor two junior engineers, Ana and Tom.", connection_id="slack-northwind"),
        Say("project_details", "I need to write the postmortem for PAY-2291 by Friday."),
        Tool(
            "github.pull_request",
            "PR #4412 'Add idempotency keys to capture path' approved by "
            "two reviewers; waiting on the load test.",
        ),
        Say("preference", "I write services in Go, and I prefer Postgres to NoSQL stores."),
        Say(
            "project_details",
            "The load test for the idempotency change runs on the staging cluster on November 12.",
        ),
        Inbox(
            {"Focus this week": "Ledger dry run and PAY-2291 postmortem"},
            ("Omar is blocked on a staging database snapshot from the data team.",),
        ),
        Say("fact", "I'm training for the Amsterdam half marathon in March."),
        Tool(
            "github.pull_request",
            "PR #4430 'Backfill ledger entries into Postgres' merged; "
            "backfill of 1.2 billion rows estimated at 9 hours.",
        ),
        Say(
            "project_details",
            "I have to get sign-off from finance on the reconciliation "
            "report format by November 20.",
        ),
        Inbox(
            {
                "Goals": [
                    "Finish ledger migration",
                    "Cut p99 capture latency below 300ms",
                    "Zero manual settlement reruns",
                ]
            },
            ("Omar confirmed the on-call swap with Dev for the week of November 24.",),
        ),
        Say("fact", "I'm allergic to peanuts."),
        Say("preference", "When summarising incidents, lead with customer impact."),
        Say("preference", "Send me alerts in Slack, not email."),
        Note(
            "github-northwind",
            "Ledger migrations need an approval from the data platform "
            "team in the migrations repo.",
        ),
        Say(
            "project_details",
            "The ledger dry run on November 18 passed with a 22 minute write freeze.",
        ),
        Inbox(
            {"Focus this week": "Cutover runbook and finance sign-off"},
            ("Omar scheduled the production ledger cutover for November 28, 06:00 UTC.",),
        ),
    ),
)

LENA = Persona(
    user_id="lena.fischer",
    organization_id="helix-labs",
    script=(
        Say("fact", "I'm the founder and CEO of Helix Labs, a climate data startup."),
        Say("fact", "I'm based in Berlin, in Kreuzberg."),
        Say(
            "project_details",
            "We're raising a 3.2 million euro seed round led by Northstar Climate Ventures.",
        ),
        Say("preference", "I want investor updates as one page with numbers first."),
        Say("fact", "I founded Helix Labs in 2024 with Arjun Mehta."),
        Tool(
            "calendar.list_events",
            "Northstar partner meeting, Tuesday 17:00, Rosenthaler Strasse office.",
        ),
        Inbox(
            {"Fundraising": {"stage": "term sheet", "lead": "Northstar Climate Ventures"}},
            ("Lena's co-founder is Arjun Mehta, who runs product.",),
        ),
        Tool(
            "docs.read_attachment",
            TERM_SHEET,
            attachment_id="att-term-sheet-draft",
            filename="Helix-Seed-Term-Sheet-Draft.pdf",
            connection_id="gmail-helix",
        ),
        Say(
            "project_details",
            "Closing of the seed round is targeted for December 12; I need "
            "to finish diligence on the weather agency data licences first.",
        ),
        Say("fact", "We have 9 people and we're hiring a head of sales."),
        Say("preference", "I don't drink coffee; green tea all day."),
        Say("project_details", "The pilot with the Hamburg port authority starts on November 16."),
        Inbox(
            {"Goals": ["Close seed by Dec 12", "Sign 3 paying pilots"]},
            ("Lena meets Northstar's partner every Tuesday at 17:00.",),
        ),
        Say("fact", "I studied physics at TU Munich before starting Helix."),
        Say("project_details", "Monthly recurring revenue is 21,000 euro across four customers."),
        Inbox(
            {"Metrics": {"mrr_eur": 21000, "customers": 4, "runway_months": 7}},
            ("Lena's runway is seven months without the seed round.",),
        ),
        Say(
            "preference", "I prefer to take calls while walking, so no screen sharing before noon."
        ),
        Say("fact", "I'm the founder and chief executive of Helix Labs, a climate data company."),
        Note("gmail-helix", "Investor threads are labelled Fundraising/Seed in Lena's inbox."),
        Say("project_details", "I need to send the November investor update by December 2."),
        Say(
            "fact",
            "Our lawyer for the round is Dr. Katrin Vogel at Hahn & Partner.",
            connection_id="gmail-helix",
        ),
        Tool(
            "hubspot.deal",
            "Deal 'Port of Hamburg pilot' moved to stage Contract Sent; value 48,000 EUR annual.",
        ),
        Say("correction", "Actually, the seed is 3.5 million euro now; Northstar upsized it."),
        Say("preference", "Put board prep in a shared doc, never in slides."),
        Inbox(
            {"Fundraising": {"stage": "confirmatory diligence", "size_eur": 3500000}},
            ("Lena is hiring a head of sales; two finalists interview next week.",),
        ),
        Say("fact", "I speak German, English and some Spanish."),
        Say("preference", "Board materials should go out 72 hours before the meeting."),
        Tool(
            "docusign.envelope",
            "Envelope 'Hamburg Port Authority pilot agreement' completed; "
            "signed by both parties on November 14.",
        ),
        Say(
            "project_details",
            "The Hamburg pilot contract is signed; kickoff on November 16 "
            "with their operations team.",
        ),
        Say("project_details", "Board meeting prep is due November 27."),
        Tool(
            "calendar.list_events",
            "Head of sales final interviews: Thursday 10:00 and 14:00 "
            "with Lena Fischer and Arjun Mehta.",
        ),
        Say("preference", "I don't drink coffee at all, only green tea."),
        Say("project_details", "Second pilot in talks with the Rotterdam water board."),
        Inbox(
            {"Focus this week": "Diligence documents and Hamburg pilot contract"},
            ("Lena asked the agencies for countersigned licences by November 20.",),
        ),
        Say("fact", "I run along the Landwehrkanal most mornings."),
        Say("preference", "Send me decisions as a short memo with a recommendation on top."),
        Say("fact", "I'm based in Berlin Kreuzberg."),
        Note("gmail-helix", "Lena forwards customer contracts to legal@helixlabs.io for filing."),
        Say("preference", "Never book anything on Friday afternoons; that is my deep work time."),
        Inbox(
            {"Hiring": {"role": "Head of Sales", "finalists": 2}},
            ("Lena prefers the finalist with utilities sales experience.",),
        ),
        Say("project_details", "I need to decide on the head of sales offer by November 21."),
        Tool(
            "hubspot.deal",
            "Deal 'Rotterdam water board pilot' created; stage Discovery; "
            "next step workshop on December 3.",
        ),
    ),
)

KENJI = Persona(
    user_id="kenji.watanabe",
    organization_id="helix-labs",
    script=(
        Say("fact", "I'm a PhD student at ETH Zurich working on machine learning for weather."),
        Say("fact", "I work part-time as a research engineer at Helix Labs."),
        Say("fact", "I live in Zurich, near Oerlikon."),
        Say("preference", "I write everything in Python with JAX, and I prefer VS Code."),
        Say("fact", "I'm in the third year of my PhD."),
        Tool("calendar.list_events", "Helix standup, Monday and Thursday 10:30, video call."),
        Say(
            "project_details",
            "My thesis chapter 3 on diffusion downscaling is due to my advisor by November 30.",
        ),
        Inbox(
            {"Advisor": {"name": "Prof. Anna Keller", "meeting": "biweekly Monday 14:00"}},
            ("Kenji's advisor is Prof. Anna Keller.",),
        ),
        Tool(
            "drive.read_attachment",
            THESIS_CHAPTER,
            attachment_id="att-thesis-ch3",
            filename="thesis-ch3-draft.pdf",
        ),
        Say("preference", "I work best late, so please no meetings before 10am."),
        Say(
            "project_details",
            "I need to rerun the Ticino evaluation with the convective "
            "correction before the advisor meeting.",
        ),
        Say("fact", "I'm vegan."),
        Say(
            "project_details",
            "The downscaling model underestimates summer convective events in the Ticino valleys.",
        ),
        Tool(
            "slurm.job",
            "Job 88123 on Euler finished: 50-member ensemble for July 2019 in "
            "3h52m on 4 A100 GPUs.",
        ),
        Inbox(
            {"Goals": ["Submit chapter 3", "Paper draft for ICLR workshop"]},
            ("Kenji shares a GPU allocation on the Euler cluster with two labmates.",),
        ),
        Say(
            "project_details",
            "At Helix I'm building the precipitation nowcasting API for the Hamburg pilot.",
        ),
        Say("preference", "Explain math with code snippets, not only equations."),
        Say("fact", "I'm a PhD student at ETH Zurich doing ML for weather."),
        Tool(
            "slack.search",
            "Arjun Mehta: the Hamburg pilot needs nowcasts at 1 km every 10 "
            "minutes; Kenji owns the API.",
        ),
        Say(
            "project_details",
            "The nowcasting API must serve 1 km nowcasts every 10 minutes "
            "before the pilot starts on November 16.",
        ),
        Note("gitlab-helix", "Kenji's nowcasting service lives in the helix/nowcast repo."),
        Say("fact", "I speak Japanese, English and a little German."),
        Inbox(
            {"Compute": {"cluster": "Euler", "gpu_quota_hours": 1200}},
            (
                "Kenji's Euler GPU quota resets on the first of each month.",
                "Kenji co-authors the workshop paper with Lena Fischer.",
            ),
        ),
        Say("preference", "I like reviews as GitLab merge request comments."),
        Say("correction", "Correction: I live in Zurich Wiedikon now, not Oerlikon."),
        Say("preference", "I prefer Python with JAX for everything, and VS Code as my editor."),
        Inbox(
            {"Focus this week": "Nowcast API latency and chapter 3 figures"},
            ("Kenji is waiting for Euler cluster quota to rerun the evaluation.",),
        ),
        Say("fact", "My GitLab handle is kwatanabe.", connection_id="gitlab-helix"),
        Say("project_details", "Workshop paper deadline is December 5."),
        Tool(
            "calendar.list_events",
            "Advisor meeting with Prof. Anna Keller moved to Tuesday 14:00, room CAB G 52.",
        ),
        Say("preference", "No meetings before 10am please, I work best late."),
        Say("fact", "I play the violin in the ETH orchestra on Wednesday evenings."),
        Say(
            "project_details",
            "Nowcast API p95 latency is 380ms; it needs to be under 250ms for the pilot.",
        ),
        Inbox(
            {"Focus this week": "Chapter 3 figures and API latency"},
            ("Kenji's chapter 3 figures are waiting on the Ticino rerun.",),
        ),
        Say(
            "project_details",
            "I moved the nowcast tiles to a Redis cache; latency dropped to 210ms.",
        ),
        Say("fact", "I'm going home to Osaka for the New Year holidays."),
        Say("preference", "I'd like paper feedback as inline comments in Overleaf."),
        Note(
            "gitlab-helix",
            "The nowcast service deploys from the main branch through the helix/deploy pipeline.",
        ),
        Say(
            "project_details",
            "I need to add the tile-cache results to the workshop paper before December 5.",
        ),
        Tool(
            "gitlab.merge_request",
            "MR !57 'Tile cache for nowcasts' merged into main by Kenji Watanabe.",
        ),
    ),
)

PERSONAS: tuple[Persona, ...] = (MAYA, OMAR, LENA, KENJI)
