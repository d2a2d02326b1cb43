//! The incremental plan as text: `EXPLAIN` and `sluice explain`.

use datafusion::common::JoinType;
use datafusion::logical_expr::LogicalPlan;

use super::check::STAGE_OUTPUT;
use super::{IncrementalPlan, StageConfig};
use crate::operator::aggregate::AggregateConfig;
use crate::operator::join::{JoinConfig, JoinEmit};
use crate::output_mode::OutputMode;

/// The incremental plan as text, for `EXPLAIN` and `sluice explain`.
pub(crate) fn explain(plan: &IncrementalPlan, sink: &str) -> String {
    let mut out = String::new();
    out.push_str(&format!("output mode: {}\n", plan.mode));
    out.push_str(&format!("sink: {sink}\n"));
    out.push_str("sources:\n");
    for i in &plan.inputs {
        out.push_str(&format!("  {}\n", i.description));
    }
    // An input's own watermark follows the event times it reads; a
    // repartition channel's is what its upstream tasks send.
    let mut marks = Vec::new();
    let mut sent = Vec::new();
    for i in &plan.inputs {
        let def = i.table.definition();
        let Some(spec) = def.watermark.as_ref() else {
            continue;
        };
        match spec.aligned {
            Some(_) => sent.push(format!(
                "{}.{}: the least of every upstream task's",
                def.name, spec.column
            )),
            None => marks.push(format!("{}.{} - {:?}", def.name, spec.column, spec.delay)),
        }
    }
    if !marks.is_empty() {
        sent.insert(
            0,
            format!("min({}) of the largest event time read", marks.join(", ")),
        );
    }
    out.push_str(&format!(
        "watermark: {}\n",
        match sent.is_empty() {
            true => "none".to_string(),
            false => sent.join("; "),
        }
    ));
    let n = plan.stages.len() + 1;
    for (i, stage) in plan.stages.iter().enumerate() {
        let header = format!(
            "stateful operator {} of {n} (its rows go to {STAGE_OUTPUT}{i}, read above it):",
            i + 1
        );
        match &stage.config {
            StageConfig::Aggregate(a) => {
                explain_aggregate(&mut out, &header, a, OutputMode::Append)
            }
            StageConfig::Join(j) => explain_join(&mut out, &header, j),
            StageConfig::Normalize(n) => {
                out.push_str(&format!(
                    "{header}\n  each key's latest value kept (keyed by the first {} column(s)), \
                     each new value emitted as the previous one taken back and the new one \
                     added\n",
                    n.keys
                ));
                indent(&mut out, &n.input);
            }
        }
    }
    let header = if n > 1 {
        format!("stateful operator {n} of {n} (the query's output):")
    } else {
        "stateful operators:".to_string()
    };
    if let Some(j) = &plan.join {
        explain_join(&mut out, &header, j);
        return out;
    }
    if let Some(t) = &plan.temporal {
        out.push_str(&format!(
            "{header}\n  temporal join ({}) FOR SYSTEM_TIME AS OF: each row joins its key's \
             version at its time once the watermark passes it, and is emitted once; kept: the \
             rows not yet passed, and the versions at or after the watermark with each key's \
             latest before it{}\n",
            t.join_type,
            if t.right_deleted.is_some() {
                " (the versioned side's deletions end their key's versions)"
            } else {
                ""
            }
        ));
        out.push_str("rows looked up (per epoch):\n");
        indent(&mut out, &t.left);
        out.push_str("versions (per epoch):\n");
        indent(&mut out, &t.right);
        out.push_str("after the join:\n");
        indent(&mut out, &t.tail);
        return out;
    }
    if let Some(o) = &plan.over {
        out.push_str(&format!(
            "{header}\n  OVER aggregation over event time: a row is computed and emitted once \
             the watermark passes it; kept: the rows not yet passed, and the emitted rows a \
             later frame reaches{}{}\n",
            o.rows_back
                .map(|n| format!(" (the last {n} of each partition)"))
                .unwrap_or_default(),
            o.range_back
                .map(|ns| format!(
                    " (those within {:?} of the watermark)",
                    std::time::Duration::from_nanos(ns.max(0) as u64)
                ))
                .unwrap_or_default(),
        ));
        out.push_str("window (per epoch, over the rows passed and those before them):\n");
        indent(&mut out, &o.window);
        out.push_str("after it:\n");
        indent(&mut out, &o.tail);
    }
    if let Some(r) = &plan.rank {
        out.push_str(&format!(
            "{header}\n  top-n: the first {} row(s) of each partition ({} PARTITION BY \
             column(s)) in ORDER BY order, state keyed by (partition, rank): {}\n",
            r.limit,
            r.partitions,
            match r.sign {
                None => format!("at most {} row(s) per partition", r.limit),
                Some(_) => "every row of each partition (its input is a changelog: a rank \
                            left empty is retracted)"
                    .to_string(),
            }
        ));
        out.push_str("rows ranked (per epoch): partition values, order values, row:\n");
        indent(&mut out, &r.input);
        out.push_str("after the Top-N (per epoch, over the changed ranks):\n");
        indent(&mut out, &r.tail);
        return out;
    }
    match &plan.aggregate {
        None => {
            out.push_str("stateful operators: none\n");
            out.push_str("stateless segment (runs over each epoch's batches):\n");
            indent(&mut out, &plan.logical);
        }
        Some(agg) => explain_aggregate(&mut out, &header, agg, plan.mode),
    }
    out
}

/// `p` indented under a heading of [`explain`].
fn indent(out: &mut String, p: &LogicalPlan) {
    for line in p.display_indent().to_string().lines() {
        out.push_str("    ");
        out.push_str(line);
        out.push('\n');
    }
}

/// A join's part of [`explain`].
fn explain_join(out: &mut String, header: &str, j: &JoinConfig) {
    let d = |ns: i64| {
        let sign = if ns < 0 { "-" } else { "+" };
        format!(
            "{sign} {:?}",
            std::time::Duration::from_nanos(ns.unsigned_abs())
        )
    };
    match (&j.bounds, &j.changelog) {
        (_, Some(sides)) => {
            let changes: Vec<&str> = [("left", sides.signs[0]), ("right", sides.signs[1])]
                .into_iter()
                .filter_map(|(name, sign)| sign.map(|_| name))
                .collect();
            out.push_str(&format!(
                "{header}\n  join ({}) over changes{}: each side's live rows are kept by join \
                 key; per epoch the keys it touches are joined before and after it, and what \
                 differs is emitted, added or taken back{}\n",
                j.join_type,
                if changes.is_empty() {
                    String::new()
                } else {
                    format!(" (the {} side(s) take rows back)", changes.join(" and "))
                },
                match &sides.emit {
                    JoinEmit::Keyed(keys) => format!("; output keyed by [{}]", keys.join(", ")),
                    JoinEmit::Signed => ", to the operator above".to_string(),
                }
            ))
        }
        (Some(b), None) => {
            let (lo, hi) = (&b.lower, &b.upper);
            let condition = if (&lo.left, &lo.right) == (&hi.left, &hi.right) {
                format!(
                    "{} - {} within [{}, {}]",
                    lo.left,
                    lo.right,
                    d(lo.ns),
                    d(hi.ns)
                )
            } else {
                format!(
                    "{} - {} >= {} and {} - {} <= {}",
                    lo.left,
                    lo.right,
                    d(lo.ns),
                    hi.left,
                    hi.right,
                    d(hi.ns)
                )
            };
            out.push_str(&format!(
                "{header}\n  interval join ({}), {condition}; each side's rows are kept until the \
                 watermark rules out a partner{}\n",
                j.join_type,
                match j.join_type {
                    JoinType::Left => ", then unmatched left rows are emitted with nulls",
                    JoinType::Right => ", then unmatched right rows are emitted with nulls",
                    JoinType::Full => ", then unmatched rows of both sides are emitted with nulls",
                    _ => "",
                }
            ))
        }
        (None, None) => out.push_str(&format!(
            "{header}\n  join (Inner) without a time bound; each side's rows are kept for ever, \
             so the state grows with the input\n"
        )),
    }
    out.push_str("left side (per epoch):\n");
    indent(out, &j.left);
    out.push_str("right side (per epoch):\n");
    indent(out, &j.right);
    out.push_str("stateless segment after the join:\n");
    indent(out, &j.tail);
}

/// An aggregation's part of [`explain`].
fn explain_aggregate(out: &mut String, header: &str, agg: &AggregateConfig, mode: OutputMode) {
    if let LogicalPlan::Aggregate(a) = &agg.aggregate {
        let keys: Vec<String> = a.group_expr.iter().map(|e| e.to_string()).collect();
        out.push_str(&format!(
            "{header}\n  aggregate (Partial -> PartialReduce with stored states -> Final), state \
             keyed by [{}]\n",
            keys.join(", ")
        ));
        if let Some(w) = &agg.window {
            let key = a.schema.field(w.column).name();
            out.push_str(&format!(
                "  event-time windows on '{}': a window's group is final when the watermark \
                 reaches {key}{}; {} then evicted\n",
                w.time_column,
                match w.to_end_ns {
                    0 => String::new(),
                    ns => format!(
                        " {} {:?}",
                        if ns < 0 { '-' } else { '+' },
                        std::time::Duration::from_nanos(ns.unsigned_abs())
                    ),
                },
                if mode == OutputMode::Append {
                    "emitted once and"
                } else {
                    "its state is"
                }
            ));
        }
    }
    out.push_str("aggregate and the stateless segment under it (per epoch):\n");
    indent(out, &agg.aggregate);
    out.push_str("stateless segment after it:\n");
    indent(out, &agg.tail);
}
