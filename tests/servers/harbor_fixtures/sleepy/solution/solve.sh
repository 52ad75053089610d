touch /app/done
