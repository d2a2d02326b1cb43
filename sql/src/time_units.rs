//! Time units written as bare words, as Flink's `TIMESTAMPADD(HOUR, 2, ts)`
//! and `TIMESTAMPDIFF(DAY, t1, t2)` take them: DataFusion would read the
//! word as a column, so before planning it becomes the text `'HOUR'` that
//! the functions (`engine/src/functions/time.rs`) read.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    visit_expressions_mut, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, Query, Value,
};

/// Rewrites the unit of every `TIMESTAMPADD` and `TIMESTAMPDIFF` in `query`.
pub(crate) fn units_as_text(query: &mut Query) {
    let _ = visit_expressions_mut(query, |e| {
        if let Expr::Function(f) = e {
            let name = f.name.to_string().to_ascii_uppercase();
            if name == "TIMESTAMPADD" || name == "TIMESTAMPDIFF" {
                if let FunctionArguments::List(list) = &mut f.args {
                    if let Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(unit))) =
                        list.args.first_mut()
                    {
                        if let Expr::Identifier(word) = unit {
                            let text = Value::SingleQuotedString(word.value.to_ascii_uppercase());
                            *unit = Expr::value(text);
                        }
                    }
                }
            }
        }
        ControlFlow::<()>::Continue(())
    });
}

#[cfg(test)]
mod tests {
    use super::units_as_text;
    use datafusion::sql::sqlparser::ast::Statement;
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::parser::Parser;

    #[test]
    fn a_bare_unit_becomes_text() {
        let sql = "SELECT TIMESTAMPADD(HOUR, 2, ts), TIMESTAMPDIFF(day, a, b), hour(ts) FROM t";
        let mut statements = Parser::parse_sql(&GenericDialect {}, sql).unwrap();
        let Statement::Query(query) = &mut statements[0] else {
            panic!("not a query");
        };
        units_as_text(query);
        assert_eq!(
            query.to_string(),
            "SELECT TIMESTAMPADD('HOUR', 2, ts), TIMESTAMPDIFF('DAY', a, b), hour(ts) FROM t"
        );
    }
}
