//! Column types as Flink writes them: `ROW<name type, ...>` (or with
//! parentheses) and `ARRAY<type>`, nested to any depth, parsed into the
//! SQL types DataFusion maps to Arrow (a `ROW` is DataFusion's `STRUCT`).
//! Every other type is the SQL parser's own. A field read with a dot is
//! named by its field, as in Flink.

use datafusion::error::DataFusionError;
use datafusion::logical_expr::{Expr, LogicalPlan, Projection};
use datafusion::scalar::ScalarValue;
use datafusion::sql::sqlparser::ast::{
    ArrayElemTypeDef, ColumnDef, ColumnOption, ColumnOptionDef, DataType, Ident, StructBracketKind,
    StructField,
};
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::{Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::Token;

/// `name type [NOT NULL | NULL] [COMMENT '...']`, with Flink's nested types.
pub(crate) fn column_def(p: &mut Parser<'_>) -> Result<ColumnDef, ParserError> {
    if !nested_ahead(p, 1) {
        let mut def = p.parse_column_def()?;
        def.data_type = flink_scalar(def.data_type);
        return Ok(def);
    }
    let name = p.parse_identifier()?;
    let mut nested = Nested::default();
    let data_type = nested.data_type(p)?;
    let mut options = Vec::new();
    loop {
        if p.parse_keywords(&[Keyword::NOT, Keyword::NULL]) {
            options.push(ColumnOptionDef {
                name: None,
                option: ColumnOption::NotNull,
            });
        } else if p.parse_keyword(Keyword::NULL) {
            options.push(ColumnOptionDef {
                name: None,
                option: ColumnOption::Null,
            });
        } else if p.parse_keyword(Keyword::COMMENT) {
            p.parse_literal_string()?;
        } else {
            break;
        }
    }
    Ok(ColumnDef {
        name,
        data_type,
        options,
    })
}

/// `name type METADATA [FROM 'key'] [VIRTUAL]`, Flink's Kafka metadata
/// column, if one is ahead: its name and the expression that reads it from
/// the Kafka source's virtual column (`'timestamp'` is `_timestamp`, cast
/// to the declared type).
pub(crate) fn metadata_column(p: &mut Parser<'_>) -> Result<Option<(Ident, String)>, ParserError> {
    let mut depth = 0usize;
    for n in 0.. {
        match p.peek_nth_token(n).token {
            Token::LParen | Token::Lt => depth += 1,
            Token::Gt if depth > 0 => depth -= 1,
            Token::ShiftRight if depth > 0 => depth = depth.saturating_sub(2),
            Token::RParen if depth > 0 => depth -= 1,
            Token::Comma | Token::RParen if depth == 0 => return Ok(None),
            Token::EOF | Token::SemiColon => return Ok(None),
            Token::Word(w) if depth == 0 && w.value.eq_ignore_ascii_case("METADATA") => break,
            _ => {}
        }
    }
    let name = p.parse_identifier()?;
    let data_type = Nested::default().data_type(p)?;
    p.next_token(); // METADATA
    let key = if p.parse_keyword(Keyword::FROM) {
        p.parse_literal_string()?
    } else {
        name.value.clone()
    };
    if let Token::Word(w) = p.peek_token().token {
        if w.value.eq_ignore_ascii_case("VIRTUAL") {
            p.next_token();
        }
    }
    let column = match key.as_str() {
        "timestamp" => "_timestamp",
        "partition" => "_partition",
        "offset" => "_offset",
        "topic" => "_topic",
        "key" => "_key",
        other => {
            return Err(ParserError::ParserError(format!(
                "metadata '{other}' is not one Sluice reads: a Kafka stream gives 'timestamp', \
                 'partition', 'offset', 'topic' and 'key' ('headers' not yet)"
            )))
        }
    };
    Ok(Some((name, format!("CAST({column} AS {data_type})"))))
}

/// Flink's names for the scalar types DataFusion knows by another:
/// `BYTES` is `BYTEA` (a binary string).
fn flink_scalar(t: DataType) -> DataType {
    match t {
        DataType::Bytes(_) => DataType::Bytea,
        t => t,
    }
}

/// Whether the `n`-th token ahead opens a `ROW` or `ARRAY` type.
fn nested_ahead(p: &Parser<'_>, n: usize) -> bool {
    let Token::Word(w) = p.peek_nth_token(n).token else {
        return false;
    };
    let next = p.peek_nth_token(n + 1).token;
    match w.value.to_ascii_uppercase().as_str() {
        "ROW" => matches!(next, Token::Lt | Token::LParen),
        "ARRAY" | "MAP" => next == Token::Lt,
        _ => false,
    }
}

/// Parses nested types; a `>>` closes two of them.
#[derive(Default)]
struct Nested {
    /// `>`s read as part of a `>>` and not yet matched.
    unmatched_gt: usize,
}

impl Nested {
    fn data_type(&mut self, p: &mut Parser<'_>) -> Result<DataType, ParserError> {
        if !nested_ahead(p, 0) {
            return p.parse_data_type().map(flink_scalar);
        }
        let word = p.next_token().token.to_string().to_ascii_uppercase();
        let angle = p.next_token().token == Token::Lt;
        match word.as_str() {
            "ARRAY" => {
                let item = self.data_type(p)?;
                self.close(p, true)?;
                Ok(DataType::Array(ArrayElemTypeDef::AngleBracket(Box::new(
                    item,
                ))))
            }
            "MAP" => Err(ParserError::ParserError(
                "MAP columns are not supported yet: declare the column as ROW<...> with the \
                 keys the values carry, or read it as VARCHAR"
                    .into(),
            )),
            _ => {
                let mut fields = Vec::new();
                loop {
                    let name = p.parse_identifier()?;
                    let field_type = self.data_type(p)?;
                    if self.unmatched_gt == 0 && p.parse_keyword(Keyword::COMMENT) {
                        p.parse_literal_string()?;
                    }
                    fields.push(StructField {
                        field_name: Some(name),
                        field_type,
                        options: None,
                    });
                    if self.unmatched_gt == 0 && p.consume_token(&Token::Comma) {
                        continue;
                    }
                    self.close(p, angle)?;
                    return Ok(DataType::Struct(fields, StructBracketKind::AngleBrackets));
                }
            }
        }
    }

    /// The `>` (or `)`) that ends a nested type.
    fn close(&mut self, p: &mut Parser<'_>, angle: bool) -> Result<(), ParserError> {
        if !angle {
            return p.expect_token(&Token::RParen).map(|_| ());
        }
        if self.unmatched_gt > 0 {
            self.unmatched_gt -= 1;
            return Ok(());
        }
        let t = p.next_token();
        match t.token {
            Token::Gt => Ok(()),
            Token::ShiftRight => {
                self.unmatched_gt += 1;
                Ok(())
            }
            other => Err(ParserError::ParserError(format!(
                "expected '>' to end the nested type, found '{other}' at {}",
                t.span.start
            ))),
        }
    }
}

/// `plan` with each field read with a dot at its top (`SELECT person.id`)
/// named by its field (`id`), as Flink names it, where DataFusion would
/// call it `t.person[id]`; a name another column has already is left.
pub(crate) fn name_fields_read(plan: LogicalPlan) -> Result<LogicalPlan, DataFusionError> {
    let LogicalPlan::Projection(projection) = plan else {
        return Ok(plan);
    };
    let field_of = |e: &Expr| match e {
        Expr::ScalarFunction(f) if f.func.name() == "get_field" => match f.args.last() {
            Some(Expr::Literal(ScalarValue::Utf8(Some(name)), _)) => Some(name.clone()),
            _ => None,
        },
        _ => None,
    };
    let mut taken: Vec<String> = projection
        .schema
        .fields()
        .iter()
        .zip(&projection.expr)
        .filter(|(_, e)| field_of(e).is_none())
        .map(|(f, _)| f.name().clone())
        .collect();
    let mut renamed = false;
    let expr: Vec<Expr> = projection
        .expr
        .iter()
        .map(|e| match field_of(e) {
            Some(name) if !taken.contains(&name) => {
                taken.push(name.clone());
                renamed = true;
                e.clone().alias(name)
            }
            _ => e.clone(),
        })
        .collect();
    if !renamed {
        return Ok(LogicalPlan::Projection(projection));
    }
    Ok(LogicalPlan::Projection(Projection::try_new(
        expr,
        projection.input,
    )?))
}

#[cfg(test)]
mod tests {
    use super::column_def;
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::parser::Parser;

    fn parse(text: &str) -> String {
        let dialect = GenericDialect {};
        let mut p = Parser::new(&dialect).try_with_sql(text).unwrap();
        column_def(&mut p).unwrap().to_string()
    }

    #[test]
    fn flinks_nested_types_become_structs_and_arrays() {
        assert_eq!(
            parse("bid ROW<auction BIGINT, url VARCHAR>"),
            "bid STRUCT<auction BIGINT, url VARCHAR>"
        );
        assert_eq!(
            parse("p ROW(id BIGINT, tags ARRAY<VARCHAR>) NOT NULL"),
            "p STRUCT<id BIGINT, tags ARRAY<VARCHAR>> NOT NULL"
        );
        assert_eq!(parse("x ROW<a ROW<b INT>>"), "x STRUCT<a STRUCT<b INT>>");
        assert_eq!(
            parse("x ARRAY<ROW<a INT, b ARRAY<INT>>>"),
            "x ARRAY<STRUCT<a INT, b ARRAY<INT>>>"
        );
        assert_eq!(parse("price BIGINT NOT NULL"), "price BIGINT NOT NULL");
    }

    #[test]
    fn flinks_bytes_is_bytea_alone_and_nested() {
        assert_eq!(parse("k BYTES NOT NULL"), "k BYTEA NOT NULL");
        assert_eq!(
            parse("x ROW<k BYTES, ks ARRAY<BYTES>>"),
            "x STRUCT<k BYTEA, ks ARRAY<BYTEA>>"
        );
    }
}
