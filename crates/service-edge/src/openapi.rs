//! Editing generated OpenAPI documents: answers that come from a layer every route shares
//! (credentials, the JSON body reader, the store) are added once, to every operation, so that
//! a new operation gets them too.

use utoipa::openapi::extensions::Extensions;
use utoipa::openapi::link::Link;
use utoipa::openapi::path::{Operation, ParameterIn};
use utoipa::openapi::{ContentBuilder, OpenApi, Ref, RefOr, ResponseBuilder};

/// Every operation of the document, with its path.
pub fn operations_mut(doc: &mut OpenApi) -> impl Iterator<Item = (&str, &mut Operation)> {
    doc.paths.paths.iter_mut().flat_map(|(path, item)| {
        [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.options,
            &mut item.head,
            &mut item.patch,
            &mut item.trace,
        ]
        .into_iter()
        .flatten()
        .map(move |operation| (path.as_str(), operation))
    })
}

/// Adds an answer for `status` whose JSON body is the `ErrorBody` schema, unless the
/// operation describes that status itself.
pub fn add_error_answer(operation: &mut Operation, status: &str, description: &str) {
    operation
        .responses
        .responses
        .entry(status.to_owned())
        .or_insert_with(|| {
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("ErrorBody")))
                        .build(),
                )
                .build()
                .into()
        });
}

/// What a link hands its target operation from the answer it leaves.
#[derive(Debug, Clone)]
pub enum LinkValue<'a> {
    /// A parameter of the target (path, query): its name and a runtime expression.
    Parameter(&'a str, &'a str),
    /// Fields of the target's JSON body, each a runtime expression; a client supplies the
    /// rest (schemathesis evaluates the expressions inside and merges in generated fields).
    Body(serde_json::Value),
}

/// Links the answer `status` of operation `from` to each of `to` (target operation id and
/// what it is given): what a client, or a fuzzer's stateful sequences, may call next with a
/// value that answer gave. Each link is named after its target operation.
pub fn add_links<'a>(
    doc: &mut OpenApi,
    from: &str,
    status: &str,
    to: impl IntoIterator<Item = (&'a str, LinkValue<'a>)>,
) {
    let Some(RefOr::T(response)) = operations_mut(doc)
        .find(|(_, op)| op.operation_id.as_deref() == Some(from))
        .and_then(|(_, op)| op.responses.responses.get_mut(status))
    else {
        return;
    };
    for (operation, value) in to {
        // Through the extensions: utoipa 5.5 writes `Link::operation_id` and `request_body`
        // in snake case, which the OpenAPI schema refuses (`operationId`, `requestBody`).
        let mut extensions = Extensions::from_iter([("operationId", operation)]);
        let mut link = Link::builder();
        match value {
            LinkValue::Parameter(name, expression) => link = link.parameter(name, expression),
            LinkValue::Body(fields) => {
                extensions.insert("requestBody".to_owned(), fields);
            }
        }
        let link = link.extensions(Some(extensions)).build();
        response.links.insert(operation.to_owned(), RefOr::T(link));
    }
}

/// The ids of the operations that take `name` as a path parameter.
pub fn operations_on(doc: &mut OpenApi, name: &str) -> Vec<String> {
    operations_mut(doc)
        .filter(|(_, op)| {
            op.parameters
                .iter()
                .flatten()
                .any(|p| p.name == name && matches!(p.parameter_in, ParameterIn::Path))
        })
        .filter_map(|(_, op)| op.operation_id.clone())
        .collect()
}
